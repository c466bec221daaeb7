"""The core's tests: ``sendfile``, ``recvfile``, ``sock_sendfile``, ``patch_loop`` and what is under them
(the lease, the outlet, the platform shim, ``_compat``), on connections the tests make themselves."""
