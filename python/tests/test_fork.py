"""fork() after a multi-threaded attn call: the child runs attn (single-threaded) instead of hanging in libgomp.

Each child runs under a time limit, so a hang fails the test instead of stalling the suite.
"""

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

import attn


def _problem():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 4, 96, 32)).astype(np.float32)
    k = rng.standard_normal((2, 4, 128, 32)).astype(np.float32)
    v = rng.standard_normal((2, 4, 128, 32)).astype(np.float32)
    return q, k, v


def test_forked_child_runs_attention_after_a_threaded_call():
    q, k, v = _problem()
    parent = attn.attention(q, k, v, causal=True, threads=2)  # an OpenMP team of two starts here
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            signal.alarm(60)
            child = attn.attention(q, k, v, causal=True, threads=2)
            os.write(write_fd, b"same" if np.array_equal(child, parent) else b"diff")
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    said = os.read(read_fd, 16)
    os.close(read_fd)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"child status {status} (SIGALRM = hung)"
    )
    assert said == b"same"
    # The parent keeps its threads.
    assert np.array_equal(attn.attention(q, k, v, causal=True, threads=2), parent)


def _work(_):
    q, k, v = _problem()
    return float(attn.attention(q, k, v, threads=2).sum())


def test_fork_pool_after_a_threaded_call():
    q, k, v = _problem()
    expected = float(attn.attention(q, k, v, threads=2).sum())
    with mp.get_context("fork").Pool(2) as pool:
        got = pool.map_async(_work, range(4)).get(timeout=120)
    assert got == [expected] * 4


class _Dataset:
    def __init__(self):
        self.q, self.k, self.v = _problem()

    def __len__(self):
        return 4

    def __getitem__(self, i):
        torch = pytest.importorskip("torch")
        q, k, v = (torch.from_numpy(x[:1]) for x in (self.q, self.k, self.v))
        return attn.attention(q, k, v, threads=2).sum()


def test_dataloader_fork_workers_after_a_threaded_call():
    torch = pytest.importorskip("torch")
    data = _Dataset()
    # the parent's pool starts before the workers fork
    attn.attention(data.q, data.k, data.v, threads=2)
    loader = torch.utils.data.DataLoader(
        data, batch_size=2, num_workers=2, multiprocessing_context="fork", timeout=120
    )
    sums = torch.cat([b for b in loader])
    expected = data[0]
    assert torch.equal(sums, expected.repeat(4))
