"""`apsat zoo` at scale on this machine: the light zoo's wall time at --jobs 1 and 2, through
a 2-worker Dask LocalCluster, and warm (every result reused); a zoo with a malformed file,
a model that hangs and one that exceeds its memory limit beside the good models; and a run
killed with SIGKILL halfway, then re-run.

Usage: python benchmarks/zoo_batch.py [--skip-dask]   (several minutes on 2 cores)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def apsat(*argv, cwd=None) -> tuple[int, float, str]:
    """Run the apsat CLI in a subprocess: (exit status, wall seconds, stderr + stdout)."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "apsat.cli", *argv], capture_output=True, text=True, cwd=cwd)
    return proc.returncode, time.perf_counter() - t, proc.stderr + proc.stdout


def light_zoo_dir(root: Path) -> Path:
    """The light models with seeded random weights, as files (what a user's zoo is)."""
    import onnx

    from apsat.pipeline.zoo import light_model_paths, randomize_weights

    d = root / "light"
    d.mkdir()
    for p in light_model_paths():
        onnx.save(randomize_weights(onnx.load(str(p)), seed=0), str(d / p.name.replace("light_", "")))
    return d


def hanging_model():
    """A Loop of 10**12 trips adding 1: folding or running it never ends."""
    from onnx import TensorProto as T
    from onnx import helper

    body = helper.make_graph([helper.make_node("Add", ["x_in", "one"], ["x_out"]),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                             [helper.make_tensor_value_info("i", T.INT64, []),
                              helper.make_tensor_value_info("cond_in", T.BOOL, []),
                              helper.make_tensor_value_info("x_in", T.FLOAT, [1])],
                             [helper.make_tensor_value_info("cond_out", T.BOOL, []),
                              helper.make_tensor_value_info("x_out", T.FLOAT, [1])],
                             initializer=[helper.make_tensor("one", T.FLOAT, [1], [1.0])])
    nodes = [helper.make_node("Loop", ["trips", "cond", "x0"], ["y"], body=body),
             helper.make_node("Add", ["y", "x"], ["out"])]
    inits = [helper.make_tensor("trips", T.INT64, [], [10**12]), helper.make_tensor("cond", T.BOOL, [], [True]),
             helper.make_tensor("x0", T.FLOAT, [1], [0.0])]
    g = helper.make_graph(nodes, "hang", [helper.make_tensor_value_info("x", T.FLOAT, [1])],
                          [helper.make_tensor_value_info("out", T.FLOAT, [1])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def memory_hog_model():
    """x (1, 32768) times a ConstantOfShape weight of 32768 x 32768 float32: 2**30 elements,
    the importer's per-tensor limit, so it imports, and 4 GiB once materialised (the light
    zoo's largest worker, VGG-19's, peaks near 3 GB)."""
    from onnx import TensorProto as T
    from onnx import helper

    n = 32768
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"], value=helper.make_tensor("v", T.FLOAT, [1], [0.5])),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    g = helper.make_graph(nodes, "hog", [helper.make_tensor_value_info("x", T.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, n])],
                          initializer=[helper.make_tensor("shape", T.INT64, [2], [n, n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def timings(zoo: Path, root: Path, dask: bool) -> list[tuple[str, float, int]]:
    rows = []
    for jobs in (1, 2):
        rc, s, _ = apsat("zoo", str(zoo), "--out", str(root / "out"), "--jobs", str(jobs), "--force")
        rows.append((f"light zoo, --jobs {jobs}", s, rc))
    rc, s, _ = apsat("zoo", str(zoo), "--out", str(root / "out"), "--jobs", "2")
    rows.append(("light zoo, warm re-run (all reused)", s, rc))
    if dask:
        rows.append(dask_run(zoo, root))
    return rows


def dask_run(zoo: Path, root: Path) -> tuple[str, float, int]:
    """The light zoo through a 2-worker LocalCluster started here."""
    from apsat.pipeline.batch_dask import local_cluster

    with local_cluster(2) as cluster:
        rc, s, _ = apsat("zoo", str(zoo), "--out", str(root / "dask-out"), "--executor", "dask",
                         "--scheduler", cluster.scheduler_address, "--force")
    return ("light zoo, Dask LocalCluster (2 workers)", s, rc)


def failures(zoo: Path, root: Path) -> tuple[int, float, list[str]]:
    """The light models plus a malformed file, a hang and a memory hog."""
    import onnx

    bad = root / "bad"
    bad.mkdir()
    for p in zoo.glob("*.onnx"):
        os.symlink(p, bad / p.name)
    (bad / "malformed.onnx").write_bytes(b"\x08\x07 not a whole model")
    onnx.save(hanging_model(), str(bad / "hangs.onnx"))
    onnx.save(memory_hog_model(), str(bad / "memory_hog.onnx"))
    rc, s, err = apsat("zoo", str(bad), "--out", str(root / "bad-out"), "--jobs", "2",
                       "--model-timeout", "120", "--max-memory", "3500")
    return rc, s, [li for li in err.splitlines() if li.startswith("apsat:") and "note:" not in li]


def killed_and_resumed(zoo: Path, root: Path) -> dict:
    """SIGKILL a --jobs 2 run once half the models are stored, then run again."""
    out = root / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "apsat.cli", "zoo", str(zoo), "--out", str(out),
                             "--jobs", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    total = len(list(zoo.glob("*.onnx")))
    while len(list((out / "results").glob("*.json"))) < total // 2 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    stored = len(list((out / "results").glob("*.json")))
    rc, s, text = apsat("zoo", str(zoo), "--out", str(out), "--jobs", "2")
    reused = sum(1 for li in text.splitlines() if "│ reused" in li)
    whole = all(json.loads((d / "report.json").read_text()).get("model") == d.name
                for d in out.iterdir() if d.is_dir() and d.name != "results")
    leftovers = [d.name for d in out.iterdir() if d.name.startswith(".")]
    return {"stored_at_kill": stored, "reused": reused, "rerun_s": s, "rerun_rc": rc, "reports_whole": whole,
            "temporaries_left": leftovers}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-dask", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        zoo = light_zoo_dir(root)
        print(f"{'run':<45} {'wall s':>8} {'exit':>5}")
        for name, s, rc in timings(zoo, root, not args.skip_dask):
            print(f"{name:<45} {s:>8.1f} {rc:>5}")
        rc, s, lines = failures(zoo, root)
        print(f"\nlight zoo + malformed + hang + memory hog: exit {rc}, {s:.1f} s, {len(lines)} failure rows:")
        for li in lines:
            print("  " + li)
        k = killed_and_resumed(zoo, root)
        print(f"\nkilled with SIGKILL at {k['stored_at_kill']} stored results; the re-run reused "
              f"{k['reused']} and took {k['rerun_s']:.1f} s, "
              f"exit {k['rerun_rc']}; every report whole: {k['reports_whole']}; temporaries left: "
              f"{k['temporaries_left'] or 'none'}")


if __name__ == "__main__":
    main()
