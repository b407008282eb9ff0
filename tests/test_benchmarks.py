"""The benchmark scripts still run: benchmarks/systolic.py on one small model and array,
benchmarks/precision.py on two models, benchmarks/systolic_width.py on its committed
SCALE-Sim runs and squeezenet (its full run over the zoo is minutes; the README quotes
it). The figures checked are properties the comparison must keep: apsat's fused program takes fewer cycles and moves
fewer DRAM words than the unfused baseline, and the flexible array is the best of the
dataflows tried or a fixed one is."""
from __future__ import annotations

from bench_scripts import load_benchmark as _load


def test_systolic_benchmark_on_squeezenet(tmp_path, capsys):
    bench = _load("systolic")
    rows = bench.run(["squeezenet"], ["32x32"], tmp_path)
    assert [(r["model"], r["backend"]) for r in rows] == [("squeezenet", b) for b in bench.BACKENDS]
    for r in rows:
        base, mine = r["baseline"], r["apsat"]
        assert base["dataflow"] in bench.DATAFLOWS and mine["dataflow"] in bench.DATAFLOWS + (bench.FLEX, bench.FLEX_FASTEST)
        assert mine["cycles"] < base["cycles"] and mine["dram"] < base["dram"]
        assert mine["cycles"] <= mine["fixed"] and 0 < mine["utilization"] <= mine["ceiling"] <= 1
        # the bounds: no stream beats its GEMMs' per-layer best, nor moves less than the floor
        assert mine["utilization"] <= mine["layer_best"] <= 1 and r["dram_floor"] < mine["dram"]
        # the flexible array's rule trades at most FLEX_CYCLE_SLACK of cycles for words
        rule = mine["by_rule"]
        assert rule["dram"] <= mine["dram"] and rule["cycles"] <= mine["cycles"] * 1.1
    summary = bench.summary(rows)
    assert len(summary) == 2 * len(bench.BACKENDS) and all("fewer cycles" in line for line in summary)
    assert [line.startswith("  the same") for line in summary] == [False, True] * len(bench.BACKENDS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["squeezenet-apsat-32x32-flex.txt",
                                                          "squeezenet-baseline-32x32.txt"]
    assert "squeezenet" in capsys.readouterr().out


def test_saturate_benchmark_measures_the_default_plan():
    from apsat.rules.saturate import default_plan
    from apsat.targets import parse_target
    from apsat.pipeline.zoo import light_model_paths

    bench = _load("saturate")
    path = next(p for p in light_model_paths() if "squeezenet" in p.name)
    for target in ("gpu", "systolic:32x32"):
        report = bench.measure(str(path), target)
        phases = [p["phase"] for p in report["phases"]]
        assert phases == [p.name for p in default_plan(parse_target(target))]
        assert report["overshoot"] == 0 and report["nodes"] > report["loaded"][0]


def test_onnx_out_benchmark_on_squeezenet():
    """One light model through benchmarks/onnx_out.py with the real exporter: the export
    passes the checker and matches the original, and the row's figures are whole."""
    bench = _load("onnx_out")
    (entry,) = bench.models(["squeezenet"], "light")
    row = bench.measure(entry, runs=20, warmup=1, min_seconds=0)
    assert row["status"] == "ok", row["status"]
    nodes = [row[k] for k in ("nodes_orig", "nodes_ort_ext", "nodes_ort_all", "nodes_export")]
    assert all(isinstance(n, int) and n > 0 for n in nodes), nodes
    assert all(row[k] > 0 for k in ("ms_orig_disable", "ms_orig_all", "ms_export"))
    assert row["runs"] == 20 and row["ratio"] == row["ms_orig_all"] / row["ms_export"]


def test_priced_rows_price_the_emitted_kernels():
    """benchmarks/priced.py on light SqueezeNet: the row's speed-up is imported over emitted
    time, the e-node figure is above the emitted one (it prices each element-wise node as
    a kernel), the model verified; the extractor table's cell is the emitted µs."""
    bench = _load("priced")
    (path,) = [p for p in bench.light_model_paths() if "squeezenet" in p.name]
    cells = dict(zip(bench.COLUMNS, bench.row(path)))
    emitted, imported = float(cells["emitted µs"]), float(cells["imported µs"])
    assert cells["speed-up"] == f"{imported / emitted:.2f}x" and cells["verified"] == "True"
    assert float(cells["e-node µs"]) > emitted
    model = bench.randomize_weights(bench.onnx.load(str(path)), seed=0)
    assert bench.by_extractor("squeezenet", model, {}, ["greedy-dag"]) == ["squeezenet", f"{emitted:.1f} ({cells['e-node µs']})"]


def test_precision_benchmark_on_squeezenet_and_gpt2(capsys):
    """benchmarks/precision.py: light SqueezeNet in float16 verifies by the float64 rule and
    its bfloat16 conversion is no valid model (Conv takes no bfloat16 at its opset); GPT-2 in
    bfloat16 verifies with its float32 copy standing in."""
    bench = _load("precision")
    assert bench.main(["squeezenet", "--zoo", "light"]) == 0
    assert bench.main(["gpt2", "--zoo", "real", "--types", "bfloat16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {tuple(line.split()[:3]) for line in lines if line.startswith(("squeezenet", "gpt2"))}
    assert rows == {("squeezenet", "float16", "ok"), ("squeezenet", "bfloat16", "invalid"),
                    ("gpt2", "bfloat16", "ok")}
    assert sum("f32 copy stands in" in line for line in lines) == 1


def test_systolic_width_benchmark(tmp_path, capsys):
    """benchmarks/systolic_width.py on its committed SCALE-Sim runs (no SCALE-Sim here)
    and on squeezenet's streams: the array does not see element widths, so apsat's
    cycles equal SCALE-Sim's CALC cycles on every finished run at 8 and 16 bits; at 16
    bits the streams move two bytes a word and no fewer words than at 8."""
    bench = _load("systolic_width")
    rows = bench.cal.read_csv(bench.DEFAULT_CSV)
    assert {int(r["word_bytes"]) for r in rows} == {1, 2} and {r["model"] for r in rows} == {"sq", "rn"}
    for r in rows:
        if r["status"] == "ok":
            assert bench.model_figures(r, int(r["word_bytes"]))[0] == int(r["total_cycles"])
    lines = bench.table(rows)
    assert len(lines) == 2 + 4 and all(" | 8 | " in line or " | 16 | " in line for line in lines[2:])
    streams = bench.streams(("squeezenet",), tmp_path)
    by = {(s["program"], s["word_bytes"]): s for s in streams}
    assert len(by) == 4
    for program in ("baseline", "apsat"):
        one, two = by[(program, 1)], by[(program, 2)]
        assert one["dram_bytes"] == one["dram_words"] and two["dram_bytes"] == 2 * two["dram_words"]
        assert two["dram_words"] >= one["dram_words"]
    for wb in (1, 2):
        assert by[("apsat", wb)]["cycles"] < by[("baseline", wb)]["cycles"]
    assert len(bench.stream_table(streams)) == 6 and "squeezenet" in capsys.readouterr().out


def test_precision_modes_benchmark_on_squeezenet(capsys):
    """benchmarks/precision_modes.py: light SqueezeNet at fp32 and fp16, the fp16 row within
    its bound with half nodes and a speed-up, none past its bound unrefused."""
    bench = _load("precision_modes")
    assert bench.main(["squeezenet", "--zoo", "light", "--modes", "fp16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[1]: line.split() for line in lines if line.startswith("squeezenet")}
    assert set(rows) == {"fp32", "fp16"} and rows["fp16"][2] == "ok"
    speed, half = float(rows["fp16"][4].rstrip("x")), rows["fp16"][6]
    assert speed > 1.0 and int(half.split("/")[0]) > 0
    assert lines[-1].endswith("0 past it unrefused")
