"""A folder's tar archive, without sockets: the layout (``_static._archive``) and the walk
(``_static._tree``). The layout's bytes, put together here as a door sends them, are read back by
``tarfile`` and equal the tree; every range of them is the same slice of the whole; the walk keeps
to the listing's rules and bounds; a member's file is checked when it is opened to be sent."""

from __future__ import annotations

import gc
import io
import os
import shutil
import subprocess
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest

from aiosendfile._static import _archive, _fs, _tree
from aiosendfile._static._archive import (
    END,
    Layout,
    Member,
    TooLarge,
    content_disposition,
    header_size,
    tar_header,
)
from aiosendfile._static._tree import MemberChanged, open_member, piece, walk
from aiosendfile._static._zip import ZipLayout

from ..support.archives import tar_members, zip_members
from ..support.files import pattern

GiB = 1024**3


def archive_bytes(path: Path, layout: Layout, start: int = 0, stop: int | None = None) -> bytes:
    """[*start*, *stop*) of the archive, put together from its parts as the door does
    (``_tree.piece``, in order)."""
    stop = layout.length if stop is None else stop
    out = bytearray()
    for span in layout.spans(start, stop):
        p = piece(str(path), layout, *span)
        out += p.before
        if p.data is not None:
            out += p.data
        elif p.fd is not None:
            try:
                out += os.pread(p.fd, p.length, p.first)
            finally:
                os.close(p.fd)
        out += p.after
    return bytes(out)


def sparse_archive(path: Path, layout: Layout, out: Path) -> None:
    """The archive written to *out* with holes where a large member's bytes go (its file is sparse:
    zeros either way): an archive past 4 GiB without writing it."""
    with open(out, "wb") as f:
        for span in layout.spans(0, layout.length):
            part, lo, _ = span
            p = piece(str(path), layout, *span)
            f.seek(layout.starts[part] + lo)
            f.write(p.before)
            if p.data is not None:
                f.write(p.data)
            elif p.fd is not None:
                os.close(p.fd)
                f.seek(p.length, os.SEEK_CUR)
            f.write(p.after)
        f.truncate(layout.length)


def first_member(header: bytes) -> tarfile.TarInfo:
    """The member a header describes, read as a stream (its body is not there to skip)."""
    with tarfile.open(
        fileobj=io.BytesIO(header), mode="r|", encoding="utf-8", errors="surrogateescape"
    ) as tf:
        info = tf.next()
    assert info is not None
    return info


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    top = tmp_path / "photos"
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "a.txt").write_bytes(b"alpha")
    (top / "sub" / "b.bin").write_bytes(pattern(70_000, seed=3))
    (top / "sub" / "deeper" / "empty").write_bytes(b"")
    (top / ("n" * 180 + ".txt")).write_bytes(b"long name")
    (top / "caf\u00e9.txt").write_bytes(b"utf-8 name")
    os.close(os.open(os.fsencode(top) + b"/latin-\xe9.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    (top / ".env").write_bytes(b"secret")
    (top / ".git").mkdir()
    (top / ".git" / "config").write_bytes(b"secret")
    (top / "link.txt").symlink_to("a.txt")
    (top / "dirlink").symlink_to("sub")
    (top / "out").symlink_to("/etc/hostname")
    os.mkfifo(top / "fifo")
    (top / "x\\..\\..\\evil.txt").write_bytes(b"a backslash")  # (a separator to some unzippers)
    return top


def test_the_archive_reads_back_as_the_tree(tree: Path) -> None:
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False)
    data = archive_bytes(tree, layout)
    assert len(data) == layout.length
    names = []
    with tarfile.open(fileobj=io.BytesIO(data), encoding="utf-8", errors="surrogateescape") as tf:
        for info in tf:
            names.append(info.name)
            if info.isfile():
                rel = os.fsencode(info.name).split(b"/", 1)[1]
                extracted = tf.extractfile(info)
                assert extracted is not None
                with open(os.fsencode(tree) + b"/" + rel, "rb") as original:
                    assert extracted.read() == original.read(), info.name
    assert names[0] == "photos"
    assert "photos/latin-\udce9.txt" in names  # (the name's own bytes, not UTF-8)
    assert "photos/" + "n" * 180 + ".txt" in names
    assert "photos/link.txt" in names  # a symlink inside the root: its file
    assert "photos/sub/deeper/empty" in names
    assert not any(n.split("/")[-1].startswith(".") for n in names)  # no dotfile
    assert not {"photos/dirlink", "photos/out", "photos/fifo"} & set(names)
    assert not any("\\" in n for n in names)
    assert layout.skipped == 4  # the link to a folder, the link out of the root, the FIFO, the backslash


def test_every_range_is_the_slice_of_the_whole(tree: Path) -> None:
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False)
    whole = archive_bytes(tree, layout)
    cuts = sorted(
        {0, 1, 511, 512, 513, 1000, 70_000, 71_000, layout.length - 1025, layout.length - 1, layout.length}
    )
    for a in cuts:
        for b in cuts:
            if a < b:
                assert archive_bytes(tree, layout, a, b) == whole[a:b], (a, b)


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("a/b.txt", 1),
        ("a/" + "x" * 96, 1),  # 98 characters
        ("a/" + "x" * 97, 1),  # 99
        ("a/" + "x" * 98, 1),  # 100: the ustar field's length
        ("a/" + "x" * 99, 1),  # 101: a pax path
        ("a/" + "x" * 96 + "/", 0),  # a folder's name and its slash
        ("a/caf\u00e9", 1),
        ("a/latin-\udce9", 1),
        ("a/big", 0o77777777777),  # the largest size ustar holds
        ("a/bigger", 0o77777777777 + 1),  # a pax size
        ("a/huge", 5 * GiB),
    ],
)
def test_header_size_is_the_headers_length(name: str, size: int) -> None:
    member = Member(name, size, 1_700_000_000 * 10**9, 0o100644, 1, 2)
    assert header_size(member) == len(tar_header(member))
    assert tar_header(member) == _archive._pax_header(member)  # (made here where it fits: the same bytes)
    info = first_member(tar_header(member))
    assert (info.name, info.size) == (name.rstrip("/"), size)


def test_dotfiles_are_taken_when_they_are_served(tree: Path) -> None:
    names = [m.name for m in walk(str(tree), "photos", str(tree.parent), dotfiles=True).members]
    assert {"photos/.env", "photos/.git/", "photos/.git/config"} <= set(names)


def test_the_bounds_refuse_a_larger_folder(tree: Path) -> None:
    count = len(walk(str(tree), "photos", str(tree.parent), dotfiles=False).members)
    walk(str(tree), "photos", str(tree.parent), dotfiles=False, max_entries=count)
    with pytest.raises(TooLarge):
        walk(str(tree), "photos", str(tree.parent), dotfiles=False, max_entries=count - 1)
    total = 5 + 70_000 + 9 + 10 + 5  # the files' bytes (link.txt is a.txt again)
    walk(str(tree), "photos", str(tree.parent), dotfiles=False, max_bytes=total)
    with pytest.raises(TooLarge):
        walk(str(tree), "photos", str(tree.parent), dotfiles=False, max_bytes=total - 1)


def test_the_etag_follows_the_tree(tree: Path) -> None:
    def etag() -> str:
        return walk(str(tree), "photos", str(tree.parent), dotfiles=False).etag

    first = etag()
    assert etag() == first  # the same tree, the same archive
    (tree / "a.txt").write_bytes(b"alphA")  # same size, new date
    os.utime(tree / "a.txt", ns=(1, 1))
    second = etag()
    assert second != first
    (tree / "new.txt").write_bytes(b"")
    third = etag()
    assert third != second
    os.chmod(tree / "a.txt", 0o600)  # (its mode is in the header; no date moves)
    assert etag() != third


def test_a_member_replaced_shrunk_or_swapped_out_is_refused_when_opened(tree: Path, tmp_path: Path) -> None:
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False)
    by_name = {m.name: m for m in layout.members}
    b = by_name["photos/sub/b.bin"]
    os.close(open_member(str(tree), b))  # unchanged: opened
    (tree / "sub" / "b.bin").write_bytes(b"short")
    with pytest.raises(MemberChanged):
        open_member(str(tree), b)  # shrunk
    a = by_name["photos/a.txt"]
    (tree / "new").write_bytes(b"alpha")
    os.rename(tree / "new", tree / "a.txt")
    with pytest.raises(MemberChanged):
        open_member(str(tree), a)  # another file under the name
    # A folder on the way swapped for a symlink to a look-alike outside: not the file planned.
    outside = tmp_path / "outside"
    (outside / "deeper").mkdir(parents=True)
    (outside / "deeper" / "empty").write_bytes(b"x")
    e = by_name["photos/sub/deeper/empty"]
    e = e._replace(size=1)
    os.rename(tree / "sub", tmp_path / "moved")
    (tree / "sub").symlink_to(outside)
    with pytest.raises(MemberChanged):
        open_member(str(tree), e)


def test_a_sparse_file_past_8_gib_is_laid_out_with_a_pax_size(tmp_path: Path) -> None:
    top = tmp_path / "big"
    top.mkdir()
    with open(top / "sparse.bin", "wb") as f:
        f.truncate(9 * GiB)
    layout = walk(str(top), "big", str(tmp_path), dotfiles=False)
    sparse = layout.members[1]
    assert sparse.size == 9 * GiB
    assert layout.length == 512 + header_size(sparse) + 9 * GiB + len(END)
    head = archive_bytes(top, layout, 0, 512 + header_size(sparse))
    tail = archive_bytes(top, layout, layout.length - 2048, layout.length)
    assert tail == bytes(2048)
    info = first_member(head[512:])
    assert (info.name, info.size) == ("big/sparse.bin", 9 * GiB)


def test_the_pool_walks_at_most_two_folders_at_once(tree: Path) -> None:
    policy = _fs.directory_policy(tree.parent, listings=True, archives=True)
    assert _fs.POOL_FS.archive(str(tree), "photos", policy).members
    held = [_fs._walks.acquire(blocking=False) for _ in range(_fs.MAX_WALKS)]
    try:
        assert all(held)
        with pytest.raises(_fs.ArchivesBusy):
            _fs.POOL_FS.archive(str(tree), "photos", policy)
    finally:
        for _ in held:
            _fs._walks.release()
    with pytest.raises(_fs.DecideInPool):
        _fs.REAL_FS.archive(str(tree), "photos", policy)  # never on the loop


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("photos.tar", 'attachment; filename="photos.tar"'),
        ('a"b.tar', "attachment; filename=\"a_b.tar\"; filename*=UTF-8''a%22b.tar"),
        ("caf\u00e9.tar", "attachment; filename=\"caf_.tar\"; filename*=UTF-8''caf%C3%A9.tar"),
        ("latin-\udce9.tar", 'attachment; filename="latin-_.tar"'),  # (not UTF-8: no filename*)
    ],
)
def test_content_disposition(name: str, field: str) -> None:
    assert content_disposition(name) == field


def test_live_layouts_are_shared_and_bounded(tree: Path, tmp_path: Path) -> None:
    """Clients downloading one folder at once share its layout; many folders at once are refused
    (503) past the budget of live entries, and admitted again once the downloads end."""
    policy = _fs.directory_policy(tree.parent, listings=True, archives=True, max_archive_entries=20)
    first = _fs.POOL_FS.archive(str(tree), "photos", policy)
    assert _fs.POOL_FS.archive(str(tree), "photos", policy) is first  # the same snapshot: shared
    del first
    gc.collect()
    folders = []
    for i in range(_fs.LIVE_LAYOUTS + 1):
        folder = tmp_path / f"folder-{i}"
        folder.mkdir()
        for j in range(19):  # and the folder itself: 20 entries, the bound
            (folder / f"f{j}").write_bytes(b"")
        folders.append(folder)
    held = [_fs.POOL_FS.archive(str(f), f.name, policy) for f in folders[:-1]]  # 4 x 20: the budget
    with pytest.raises(_fs.ArchivesBusy):
        _fs.POOL_FS.archive(str(folders[-1]), "last", policy)
    del held
    gc.collect()
    assert _fs.POOL_FS.archive(str(folders[-1]), "last", policy).members  # the budget is free again


def test_the_zip_reads_back_as_the_tree(tree: Path) -> None:
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False, kind=ZipLayout)
    tar = walk(str(tree), "photos", str(tree.parent), dotfiles=False)
    data = archive_bytes(tree, layout)
    assert len(data) == layout.length
    expected = tar_members(archive_bytes(tree, tar))
    assert zip_members(data) == expected
    assert layout.etag != tar.etag
    assert layout.etag.startswith('"zip-')
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = zf.getinfo("photos/caf\u00e9.txt")
        assert info.flag_bits & 0x800  # UTF-8
        assert (info.external_attr >> 16) & 0o777 == 0o644
        assert zf.getinfo("photos/sub/").external_attr & 0x10  # a folder
    if shutil.which("unzip"):
        out = tree.parent / "t.zip"
        out.write_bytes(data)
        done = subprocess.run(["unzip", "-t", str(out)], capture_output=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert b"No errors detected" in done.stdout


def test_every_range_of_the_zip_is_the_slice_of_the_whole(tree: Path) -> None:
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False, kind=ZipLayout)
    whole = archive_bytes(tree, layout)
    n = len(layout.members)
    cuts = sorted(
        {
            0,
            1,
            29,
            30,
            31,
            70_000,
            layout.starts[n],
            layout.starts[n] + 47,
            layout.starts[2 * n],
            layout.length - 1,
            layout.length,
        }
    )
    for a in cuts:
        for b in cuts:
            if a < b:
                assert archive_bytes(tree, layout, a, b) == whole[a:b], (a, b)


def test_a_large_zip_member_rewritten_with_its_date_put_back_is_refused(tree: Path) -> None:
    """A large member's bytes go by ``sendfile`` after its CRC-32 was read: one rewritten in place
    at the same size with its modification time put back (``cp -p``, ``rsync --inplace -t``,
    ``touch -r``) went out with the old CRC, a zip of the announced length that ``unzip``
    rejects (a review). Its change time moved: its CRC is read again before it goes, and a
    mismatch is refused; a ``chmod`` alone (its bytes the same) is sent."""
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False, kind=ZipLayout)
    index = {m.name: i for i, m in enumerate(layout.members)}
    _tree.member_crc(str(tree), layout, index["photos/sub/b.bin"])
    span = next(
        s
        for s in layout.spans(0, layout.length)
        if (m := layout.body_of(s[0])) and m.name == "photos/sub/b.bin"
    )
    large = tree / "sub" / "b.bin"
    os.chmod(large, 0o600)  # (its change time moves, not its bytes)
    kept = piece(str(tree), layout, *span)
    assert kept.fd is not None
    os.close(kept.fd)
    st = large.stat()
    with open(large, "r+b") as f:
        f.write(b"rewritten")
    os.utime(large, ns=(st.st_atime_ns, st.st_mtime_ns))  # (its date put back)
    with pytest.raises(MemberChanged):
        piece(str(tree), layout, *span)


def test_a_zip_past_4_gib_takes_zip64_fields(tmp_path: Path) -> None:
    top = tmp_path / "big"
    top.mkdir()
    with open(top / "a-sparse.bin", "wb") as f:
        f.truncate(5 * GiB)
    (top / "b-after.txt").write_bytes(b"after the big one")
    layout = walk(str(top), "big", str(tmp_path), dotfiles=False, kind=ZipLayout)
    # (its CRC would take reading 5 GiB: a made-up one, as the layout would hold it)
    layout.crcs[1] = 0x1234ABCD
    layout.crc_mtimes[1] = layout.members[1].mtime_ns
    out = tmp_path / "big.zip"
    sparse_archive(top, layout, out)
    with zipfile.ZipFile(out) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        assert infos["big/a-sparse.bin"].file_size == 5 * GiB
        assert infos["big/a-sparse.bin"].CRC == 0x1234ABCD
        assert infos["big/b-after.txt"].header_offset > 4 * GiB
        assert zf.read("big/b-after.txt") == b"after the big one"  # (its CRC checked)
    if shutil.which("zipinfo"):
        listed = subprocess.run(["zipinfo", str(out)], capture_output=True, text=True, check=True).stdout
        assert "5368709120" in listed


def test_crcs_are_kept_by_identity(tree: Path) -> None:
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False, kind=ZipLayout)
    b = next(m for m in layout.members if m.name == "photos/sub/b.bin")
    first = _tree.crc_read(str(tree), b)[0]
    assert first == zlib.crc32((tree / "sub" / "b.bin").read_bytes())
    os.rename(tree / "sub" / "b.bin", tree / "moved")  # gone: the kept CRC answers without opening it
    assert _tree.crc_read(str(tree), b)[0] == first
    assert len(_tree._crcs) <= _tree.CRC_CACHE_ENTRIES


def test_a_zip_of_more_than_65535_entries_takes_the_zip64_end_records() -> None:
    members = [Member(f"top/d{i:05}/", 0, 10**18, 0o40755, 1, i) for i in range(70_000)]
    layout = ZipLayout(members)
    data = b"".join(layout.around(part, lo, hi)[0] for part, lo, hi in layout.spans(0, layout.length))
    assert len(data) == layout.length
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
    assert len(names) == 70_000
    assert names[-1] == "top/d69999/"


def test_a_large_files_crc_read_ticks_on_the_way(tmp_path: Path) -> None:
    """Reading a large file's CRC-32 is progress for the connection's send timeout: ticks. It is
    then known to the layout and to the cache (a second download of the same snapshot)."""
    top = tmp_path / "t"
    top.mkdir()
    with open(top / "sparse.bin", "wb") as f:
        f.truncate(2 * _tree.TICK_BYTES + 5)
    layout = walk(str(top), "t", str(tmp_path), dotfiles=False, kind=ZipLayout)
    ticks: list[int] = []
    assert not _tree.crc_known(layout, 1)
    crc = _tree.member_crc(str(top), layout, 1, lambda: ticks.append(1))
    assert len(ticks) == 2
    assert _tree.crc_known(layout, 1)
    assert crc == zlib.crc32(bytes(5), zlib.crc32(bytes(2 * _tree.TICK_BYTES)))
    again = walk(str(top), "t", str(tmp_path), dotfiles=False, kind=ZipLayout)
    assert _tree.crc_known(again, 1)  # (by the file's identity)


def test_a_symlink_turned_outside_after_the_walk_is_refused_when_opened(tmp_path: Path) -> None:
    """A member reached by a symlink inside the root, pointed outside the root at an outside file
    that is the very same inode (a hard link there), is refused: the descriptor opened is checked."""
    root = tmp_path / "root"
    top = root / "top"
    top.mkdir(parents=True)
    (top / "inside.txt").write_bytes(b"inside")
    (top / "link.txt").symlink_to("inside.txt")
    layout = walk(str(top), "top", str(root), dotfiles=False)
    link = next(m for m in layout.members if m.name == "top/link.txt")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.link(top / "inside.txt", outside / "same-inode.txt")
    (top / "link.txt").unlink()
    (top / "link.txt").symlink_to(outside / "same-inode.txt")
    with pytest.raises(MemberChanged):
        open_member(str(top), link, layout.root)


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_setuid_setgid_and_sticky_bits_are_left_out(tmp_path: Path, kind: str) -> None:
    """Members are written as root's (uid and gid 0): a setuid file of any user's, or a setgid
    folder, would come out of a ``sudo tar -x`` (or ``bsdtar``, or ``tarfile``'s trusted filter)
    setuid root. Modes keep their permission bits only (0o777), as a file type in zip."""
    top = tmp_path / "top"
    (top / "sg").mkdir(parents=True)
    tool = top / "tool"
    tool.write_bytes(b"#!/bin/sh\nid\n")
    tool.chmod(0o4755)
    (top / "sg").chmod(0o3777)
    layout = walk(str(top), "top", str(tmp_path), dotfiles=False, kind=ZipLayout if kind == "zip" else Layout)
    data = archive_bytes(top, layout)
    if kind == "tar":
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            modes = {m.name: m.mode for m in tf.getmembers()}
    else:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            modes = {i.filename.rstrip("/"): i.external_attr >> 16 for i in zf.infolist()}
            assert (zf.getinfo("top/tool").external_attr >> 16) & 0o170000 == 0o100000  # (a regular file)
    assert modes["top/tool"] & 0o7777 == 0o755
    assert modes["top/sg"] & 0o7777 == 0o777


def test_a_zip_member_rewritten_after_its_crc_was_read_is_refused(tree: Path) -> None:
    """A zip's CRC-32 is read before the member's bytes are made ready: a small file rewritten
    in place since (same size, new bytes) is refused by the CRC of the bytes read for it; a large
    one by its dates (its bytes go later, by ``sendfile``), and a CRC read while the file was
    rewritten is not kept. A file that only grew keeps its CRC (of the announced size)."""
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False, kind=ZipLayout)
    index = {m.name: i for i, m in enumerate(layout.members)}
    for name in ("photos/a.txt", "photos/sub/b.bin"):
        _tree.member_crc(str(tree), layout, index[name])  # (read now, as a range deep in it would)
    spans = {m.name: span for span in layout.spans(0, layout.length) if (m := layout.body_of(span[0]))}
    small = tree / "a.txt"
    small.write_bytes(bytes(b ^ 1 for b in small.read_bytes()))  # (same size)
    with pytest.raises(MemberChanged):
        piece(str(tree), layout, *spans["photos/a.txt"])
    large = tree / "sub" / "b.bin"
    with open(large, "r+b") as f:
        f.write(b"rewritten")
    os.utime(large, ns=(1, 2))  # (a new date, whatever the clock's step)
    with pytest.raises(MemberChanged):
        piece(str(tree), layout, *spans["photos/sub/b.bin"])
    fresh = walk(str(tree), "photos", str(tree.parent), dotfiles=False, kind=ZipLayout)
    b = next(m for m in fresh.members if m.name == "photos/sub/b.bin")
    os.utime(large, ns=(3, 4))  # changed again after the walk: its CRC read now is this archive's
    assert _tree.crc_read(str(tree), b) == (zlib.crc32(large.read_bytes()), 4)
    assert _tree._crc_key(b) not in _tree._crcs  # (not kept under the walk's identity)


def test_a_zip_member_touched_or_chmoded_is_sent_whole(tree: Path) -> None:
    """A file whose bytes did not change (``touch``, ``chmod``, a hard link: new times) is not
    taken for a rewritten one: the zip is whole and its CRCs match (such a download was cut)."""
    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False, kind=ZipLayout)
    for name in ("a.txt", "sub/b.bin"):
        path = tree / name
        os.utime(path, ns=(5, 6))
        path.chmod(0o600)
        os.link(path, tree.parent / f"link-{path.name}")
    data = archive_bytes(tree, layout)
    assert len(data) == layout.length
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        assert zf.read("photos/sub/b.bin") == (tree / "sub" / "b.bin").read_bytes()


def test_a_file_whose_path_is_too_long_to_open_is_left_out(tmp_path: Path) -> None:
    """A tree deeper than PATH_MAX bytes (folders of 243-byte names) is walked by descriptor, but
    its deepest files could not be opened by their path to be sent: every download of it was cut
    at the first (an empty answer). They are left out and counted as skipped."""
    top = tmp_path / "top"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for n in range(20):
            name = b"d%02d" % n + b"x" * 240
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
            f = os.open("f.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
            os.write(f, b"x")
            os.close(f)
    finally:
        os.close(fd)
    layout = walk(str(top), "top", str(tmp_path), dotfiles=False)
    assert layout.skipped >= 1
    files = [m for m in layout.members if not m.is_dir]
    assert 10 <= len(files) < 20
    data = archive_bytes(top, layout)  # (every member left in opens: none is too long)
    assert len(data) == layout.length
    assert layout.skipped + len(files) == 20


def test_a_zip_says_each_members_time_exactly_in_an_extended_timestamp(tree: Path) -> None:
    """MS-DOS dates have no time zone (unzip reads them as local time: files came out off by the
    local offset from UTC): each member's local header and central record carry Info-ZIP's
    extended timestamp (0x5455, the modification time in seconds since the epoch), which unzip,
    bsdtar and 7-Zip set the extracted file's time from, in any time zone."""
    import struct

    layout = walk(str(tree), "photos", str(tree.parent), dotfiles=False, kind=ZipLayout)
    data = archive_bytes(tree, layout)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        for info in zf.infolist():
            extra = info.extra
            at = extra.find(b"UT\x05\x00\x01")
            assert at >= 0, (info.filename, extra)
            (seconds,) = struct.unpack_from("<I", extra, at + 5)
            path = tree.parent / info.filename.rstrip("/")
            if info.filename.startswith("photos/latin-"):
                continue  # (a name that is not UTF-8: zipfile reads it as cp437)
            assert seconds == os.stat(path).st_mtime_ns // 1_000_000_000, info.filename
            local = data[info.header_offset : info.header_offset + 30 + len(info.filename.encode()) + 64]
            assert b"UT\x05\x00\x01" + struct.pack("<I", seconds) in local
    if shutil.which("unzip"):
        out = tree.parent / "t.zip"
        out.write_bytes(data)
        into = tree.parent / "out"
        env = {**os.environ, "TZ": "America/New_York"}
        done = subprocess.run(
            ["unzip", "-q", str(out), "-d", str(into)], capture_output=True, env=env, check=False
        )
        assert done.returncode == 0, done.stderr
        assert (into / "photos" / "a.txt").stat().st_mtime == int((tree / "a.txt").stat().st_mtime)
