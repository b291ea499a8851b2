"""A process's identity is read when asked, never fixed at import: a child forked from a
parent that imported recallq (`recallq worker --processes`, the tests' launcher) is itself."""

from __future__ import annotations

import os

from recallq.coordination.liveness import this_process_id


def test_a_forked_child_is_not_its_parent() -> None:
    parent = this_process_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its id and leave without running pytest's exit
        os.write(write, this_process_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1024).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert parent.endswith(f":{os.getpid()}")
    assert child.endswith(f":{pid}") and child != parent
