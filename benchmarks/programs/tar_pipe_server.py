"""A folder's tar archive the way a server without zero-copy makes one: GNU ``tar -cf -`` into a
pipe, its output copied to the socket in 256 KiB reads and writes (as miniserve streams its tar).
A stand-in for the directory servers the archive benchmark compares with, where they cannot be
installed. Standard library only; no ``Content-Length`` (the length is not known ahead), so the
answer ends when the connection closes (HTTP/1.0).

    python -m benchmarks.programs.tar_pipe_server ROOT PORT      # GET /NAME/?tar
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import urllib.parse


def main() -> None:
    root, port = os.path.realpath(sys.argv[1]), int(sys.argv[2])

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            name = urllib.parse.unquote(self.path.split("?", 1)[0]).strip("/")
            folder = os.path.realpath(os.path.join(root, name))
            if not folder.startswith(root) or not os.path.isdir(folder):
                self.send_error(404)
                return
            top = os.path.basename(folder)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            self.end_headers()
            with subprocess.Popen(
                ["tar", "-cf", "-", "-C", os.path.dirname(folder), top], stdout=subprocess.PIPE
            ) as tar:
                assert tar.stdout is not None
                shutil.copyfileobj(tar.stdout, self.wfile, 256 * 1024)

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
