"""The one bounded npz reader (issue 23): a small hostile file never makes
sparkavg allocate what it declares, on every route that reads an npz.

Peak memory is measured in a fresh subprocess (tracemalloc peak and growth of
the peak resident set), so one test's allocations cannot hide another's.
"""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

from sparkavg.npzfile import NpzError, load_npy_bytes, load_npz

from .test_model_files import members, npy, npy_header, small_net

LIMIT = 64 << 20  # what refusing a hostile file may cost (traced or resident)


def write_zip(path, entries) -> None:
    """A plain zip of ``(name, data, method, declared compressed size, declared size, crc)``
    entries, trusting every declared field (the central directory is what readers believe)."""
    out, central = bytearray(), bytearray()
    for name, data, method, csize, size, crc in entries:
        name = name.encode()
        offset = len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(data), size,
                           len(name), 0) + name + data
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc, csize, size,
                               len(name), 0, 0, 0, 0, 0, offset) + name
    out += central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central),
                                 len(out), 0)
    path.write_bytes(bytes(out))


def entry(name, data: bytes):
    return (name, data, 0, len(data), len(data), zlib.crc32(data))


def bomb_entry(name, dtype, shape):
    """A deflated .npy member of zeros: a few hundred KB expanding to the whole declared array."""
    header = npy_header(dtype, shape)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk, left = bytes(1 << 22), int(np.prod(shape)) * np.dtype(dtype).itemsize
    crc, body = zlib.crc32(header), bytearray(comp.compress(header))
    while left:
        piece = chunk[:min(left, len(chunk))]
        crc = zlib.crc32(piece, crc)
        body += comp.compress(piece)
        left -= len(piece)
    body += comp.flush()
    return (name, bytes(body), 8, len(body), len(header) + int(np.prod(shape)) * np.dtype(dtype).itemsize, crc)


def measured(code: str) -> dict:
    """Run ``code`` (which sets ``error``) in a fresh interpreter; its peak memory and error."""
    script = textwrap.dedent("""
        import json, resource, sys, tracemalloc
        sys.path.insert(0, {root!r})
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        tracemalloc.start()
        error = None
        try:
        {body}
        except Exception as exc:
            error = f"{{type(exc).__name__}}: {{exc}}"
        peak = tracemalloc.get_traced_memory()[1]
        print(json.dumps({{"peak": peak, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss,
                          "error": error}}))
    """).format(root=os.getcwd(), body=textwrap.indent(textwrap.dedent(code), "    "))
    # the imports before tracemalloc starts: what is measured is the load
    script = script.replace("tracemalloc.start()", "import numpy, sparkavg.nn, sparkavg.spark.checkpoint\n"
                            "tracemalloc.start()", 1)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def assert_bounded(result: dict, *patterns) -> None:
    assert result["error"] is not None, "the hostile file loaded"
    assert result["peak"] < LIMIT, f"refusing it allocated {result['peak'] / 2**20:.0f} MiB first: {result['error']}"
    assert result["rss"] < LIMIT, f"refusing it grew peak RSS by {result['rss'] / 2**20:.0f} MiB: {result['error']}"
    for pattern in patterns:
        assert pattern in result["error"], result["error"]


def test_a_tiny_model_file_declaring_huge_stored_members_allocates_nothing(tmp_path):
    # 10^4 -> 10^4 dense output with Adam: 10^8 parameters and 2 x 10^8 state values, 1.2 GB declared,
    # under the default max_params.
    net = small_net()
    config = {"type": "Network", "input_shape": [10**4], "layers": [{"type": "Output", "units": 10**4}],
              "updater": {"type": "Adam", "lr": 0.001}, "seed": 1, "dtype": "float32"}
    m = members(net, config=config)
    n = 10**4 * 10**4 + 10**4
    entries = [entry(f"{k}.npy", npy(v)) for k, v in m.items() if k not in ("params", "updater_state")]
    for name, length in (("params", n), ("updater_state", 2 * n)):
        header = npy_header("<f4", (length,))
        size = len(header) + 4 * length  # declared in the directory; the data is not there
        entries.append((f"{name}.npy", header, 0, size, size, 0))
    path = tmp_path / "forged.npz"
    write_zip(path, entries)
    assert path.stat().st_size < 4096
    assert_bounded(measured(f"""
        from sparkavg.nn import Network
        Network.load({str(path)!r})
    """), str(path), "member 'params' declares 400,040,128 bytes of data", "expected every member inside the file")


def test_a_compressed_bomb_in_runner_npz_is_refused_on_resume(tmp_path):
    from sparkavg.spark.checkpoint import save_checkpoint

    net = small_net()
    folder = save_checkpoint(str(tmp_path), net, run_id="r", epochs_done=1, target_epochs=2, master={},
                             runner_state={"block_momentum_delta": np.zeros(23, np.float32)})
    write_zip(tmp_path / "bomb.npz", [bomb_entry("block_momentum_delta.npy", "<f4", (50 * 2**20,))])
    os.replace(tmp_path / "bomb.npz", os.path.join(folder, "runner.npz"))
    assert os.path.getsize(os.path.join(folder, "runner.npz")) < 400_000  # 200 MiB of zeros, deflated
    assert_bounded(measured(f"""
        from sparkavg.spark.checkpoint import list_checkpoints
        list_checkpoints({str(tmp_path)!r})[0].load_runner_state()
    """), "CheckpointError", "runner.npz", "expands 203,929 compressed bytes to 209,715,328", "refusing a possible zip bomb")


def test_runner_state_round_trips_through_the_bounded_reader(tmp_path):
    from sparkavg.spark.checkpoint import list_checkpoints, save_checkpoint

    state = {"block_momentum_delta": np.arange(23, dtype=np.float32), "round_costs_source": "measured",
             "round_costs_rounds": 3}
    save_checkpoint(str(tmp_path), small_net(), run_id="r", epochs_done=1, target_epochs=2, master={},
                    runner_state=state)
    back = list_checkpoints(str(tmp_path))[0].load_runner_state()
    assert np.array_equal(back["block_momentum_delta"], state["block_momentum_delta"])
    assert back["round_costs_source"].item() == "measured" and back["round_costs_rounds"].item() == 3


def test_load_npz_refuses_object_members_and_bounds_the_total(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, a=np.zeros(10, np.float32), b=np.array([{"x": 1}], dtype=object))
    with pytest.raises(NpzError, match=r"a.npz: member 'b' is a pickled object array"):
        load_npz(path, max_bytes=1 << 20)
    np.savez(path, a=np.zeros(1000, np.float32))
    with pytest.raises(NpzError, match=r"members declare 4,128 bytes; expected at most 4,000"):
        load_npz(path, max_bytes=4000)
    assert load_npz(path, max_bytes=1 << 20)["a"].shape == (1000,)


def test_npy_blobs_are_checked_against_their_length_before_allocating():
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert np.array_equal(load_npy_bytes(buf.getvalue()), np.arange(6, dtype=np.float32).reshape(2, 3))
    forged = npy_header("<f4", (2**30,)) + bytes(16)
    with pytest.raises(NpzError, match=r"expected a plain array filling the \d+-byte blob, got a header declaring "
                                       r"float32 of shape \(1073741824,\)"):
        load_npy_bytes(forged, what="a minibatch blob")
