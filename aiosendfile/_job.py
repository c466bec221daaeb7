"""One ``sendfile`` call as the drivers see it: what goes where, how, and how far it got.

``_api`` resolves the target and the file, plans the byte range and builds a
:class:`SendJob`; the zero-copy driver (``_writer``) and the userspace copy
(``_fallback``) take it whole instead of a list of its parts. Its ``state``
is the transfer's one byte counter: the drivers advance it, ``map_exceptions``
reads ``.sent`` from it, and the file position is set from it at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._options import Options
from ._state import TransferState
from ._target import FileInfo, Target

__all__ = ("SendJob",)


@dataclass
class SendJob:
    """A resolved, planned transfer. ``options`` loses its headers once they have gone out.

    ``headers_sent``/``trailers_sent`` say how much of each the zero-copy driver has
    sent, so a transfer begun synchronously (``_writer.send_at_once``) resumes mid-header.
    """

    target: Target
    file: FileInfo
    state: TransferState
    options: Options
    zero_copy: bool  # the target and the file allow sendfile(2)
    fallback: bool  # the caller allows a userspace copy where zero-copy fails
    headers_sent: int = 0
    trailers_sent: int = 0
    held: bool = False  # a send flagged MSG_MORE may wait for a next send that has not come yet
    # The next chunk was found cold: the pool sends it without a second probe. Without cachestat
    # the probe is a 1-byte read that starts bringing the pages in, and a probe a moment later
    # would find the first ones there and send the chunk on the loop thread.
    cold: bool = False
