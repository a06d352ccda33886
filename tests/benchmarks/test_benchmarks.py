"""The benchmark suite runs and writes valid JSON (no timing is asserted: timings belong to the machine)."""

from __future__ import annotations

import json

import pytest
import torch

from dpnotebook.benchmarks.__main__ import (
    Config,
    ghost_hooks_table,
    groups,
    main,
    measure,
    measure_group,
    multiplicity_table,
    opacus_table,
    parse_args,
    plan,
    results_table,
)
from dpnotebook.benchmarks.models import MODELS, TRANSFORMER_MODELS, build
from dpnotebook.benchmarks.steps import make_step, opacus_step


@pytest.mark.slow  # the benchmark command line, end to end
def test_cli_runs_one_tiny_configuration_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = [
        "--models",
        "MLP",
        "--batch",
        "4",
        "--modes",
        "ghost",
        "--kinds",
        "dpsgd",
        "--ks",
        "1",
        "--steps",
        "1",
        "--min-seconds",
        "0",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    rows = {r["what"]: r for r in data["rows"]}
    assert set(rows) == {"nonprivate", "dpsgd_ghost"}
    for r in rows.values():
        assert "error" not in r, r
        assert r["median_ms"] > 0 and r["peak_mb"] > 0 and r["n"] == 1 and r["ratio"] > 0
    assert data["settings"]["torch"] == torch.__version__
    assert "| MLP | 4 | 1 | dpsgd_ghost |" in capsys.readouterr().out
    assert main(["--report", str(out)]) == 0 and "dpsgd_ghost" in capsys.readouterr().out


@pytest.mark.slow  # one subprocess for the group
def test_grouped_cli_times_a_model_and_batch_in_one_process(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = ["--models", "MLP", "--batch", "4", "--modes", "hooks", "ghost", "--kinds", "dpsgd", "--ks", "1"]
    argv += ["--steps", "2", "--warmup", "1", "--threads", "1", "--device", "cpu", "--grouped", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    rows = {r["what"]: r for r in data["rows"]}
    assert list(rows) == ["nonprivate", "dpsgd_hooks", "dpsgd_ghost"] and data["settings"]["grouped"] is True
    # one process, one reference: every ratio divides by the same non-private median
    assert {r["ref_median_ms"] for r in rows.values()} == {rows["nonprivate"]["median_ms"]}
    assert rows["nonprivate"]["ratio"] == 1.0 and all(r["n"] == 2 and r["note"] == "grouped" for r in rows.values())
    # ghost's row knows hooks' time from the same rounds, so the table's same-process column is filled
    assert rows["dpsgd_ghost"]["rival_median_ms"] == rows["dpsgd_hooks"]["median_ms"]
    assert "configurations, each (model, B, K) in one process" in capsys.readouterr().err


def test_grouped_measurement_keeps_a_failure_as_its_row() -> None:
    cfgs = [Config("MLP", 2, 1, w) for w in ("nonprivate", "dpsgd_ghost", "dpsgd_jax")]
    rows = measure_group(cfgs, steps=2, warmup=1, threads=1)
    assert [r["what"] for r in rows] == ["nonprivate", "dpsgd_ghost", "dpsgd_jax"]
    assert rows[1]["ratio"] == rows[1]["median_ms"] / rows[0]["median_ms"] and rows[1]["peak_mb"] >= 0
    assert "configuration 'dpsgd_jax' is unknown" in rows[2]["error"] and "median_ms" not in rows[2]
    assert "ERROR" in results_table(rows)


def test_groups_and_the_gpu_preset() -> None:
    configs = plan(["MLP", "SampleConvNet"], [8], modes=["hooks"], kinds=["dpsgd"], ks=[4], k_batch=2)
    keys = [(g[0].model, g[0].batch, g[0].K) for g in groups(configs)]
    assert keys == [("MLP", 8, 1), ("MLP", 2, 4), ("SampleConvNet", 8, 1), ("SampleConvNet", 2, 4)]
    assert all(g[0].what == "nonprivate" for g in groups(configs))
    args = parse_args(["--gpu", "--device", "cpu"])
    assert args.batch == [512, 2048] and args.kinds == ["dpsgd", "graphed"] and args.ks == [1] and args.grouped is True
    assert parse_args(["--no-grouped"]).grouped is False and parse_args([]).grouped is None
    # an option given beside a preset wins over the preset's value
    given = parse_args(["--gpu", "--models", "MLP", "--batch", "16", "--steps", "3"])
    assert given.models == ["MLP"] and given.batch == [16] and given.steps == 3 and given.kinds == ["dpsgd", "graphed"]
    assert parse_args(["--quick", "--batch", "8"]).batch == [8]


def test_plan_covers_modes_kinds_multiplicity_and_opacus() -> None:
    configs = plan(
        ["LSTMClassifier"], [8], modes=["hooks"], kinds=["gsm", "dpsgd", "naive"], ks=[1, 4], k_batch=2, opacus=True
    )
    whats = [(c.batch, c.K, c.what) for c in configs]
    assert (8, 1, "nonprivate_dplayers") in whats and (8, 1, "naive_microbatch") in whats
    assert (8, 1, "opacus_dpsgd_ghost") in whats and (8, 1, "opacus_gsm_ghost") not in whats
    assert (2, 4, "nonprivate") in whats and (2, 4, "dpsgd_ghost") in whats and (2, 1, "gsm_hooks") in whats
    assert not any(w.startswith("graphed_") for _, _, w in whats)  # asked for by name (--gpu asks)
    graphed = plan(["MLP"], [8], modes=["hooks", "ew"], kinds=["graphed"])
    assert [c.what for c in graphed] == ["nonprivate", "graphed_hooks"]  # GRAPHED_MODES: hooks and ghost


def test_quick_preset_and_bad_arguments() -> None:
    args = parse_args(["--quick"])
    assert args.batch == [128] and "ghost" in args.modes and args.ks == [1, 16]
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])
    for bad in (["--min-seconds", "-1"], ["--steps", "20", "--max-steps", "10"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_builds_in_every_flavour(name: str) -> None:
    for flavour in ("dp", "native"):
        model, inputs, y, _ = build(name, 2, K=2, flavour=flavour)
        assert model(*inputs).shape == (4, 10) and y.shape == (4,)


def test_transformers_preset() -> None:
    args = parse_args(["--transformers"])
    assert args.models == [*TRANSFORMER_MODELS, "TextTransformer"] and args.modes == ["hooks", "ghost"]
    assert args.batch == [32] and args.kinds == ["dpsgd"] and args.threads == 1 and args.rival


def test_rival_times_hooks_mode_in_the_ghost_rows_process() -> None:
    row = measure(Config("MLP", 2, 1, "dpsgd_ghost"), steps=3, warmup=1, threads=1, rival=True)
    assert row["rival"] == "dpsgd_hooks" and row["rival_median_ms"] > 0 and row["rival_min_ms"] > 0
    assert "rival" not in measure(Config("MLP", 2, 1, "dpsgd_hooks"), steps=2, warmup=1, threads=1, rival=True)
    hooks = {**row, "what": "dpsgd_hooks"}
    line = ghost_hooks_table([row, hooks]).splitlines()[2]
    assert line.endswith(f"| {row['median_ms'] / row['rival_median_ms']:.2f} |")


@pytest.mark.parametrize("name", sorted(TRANSFORMER_MODELS))
def test_every_transformer_builds_and_its_steps_run(name: str) -> None:
    model, inputs, y, loss = build(name, 2)
    out = model(*inputs)
    assert inputs[0].shape == (2, 64) and out.shape[0] == 2 and out.shape[1:] in {(10,), (64, 1000)}
    assert loss(out, y).shape == ()
    make_step(name, "nonprivate", batch=2)()
    for what in ("dpsgd_hooks", "dpsgd_ghost"):
        make_step(name, what, batch=2)()


@pytest.mark.parametrize("what", ["gsm_hooks", "dpsgd_ghost", "naive_microbatch", "gsm_ghost"])
def test_steps_run(what: str) -> None:
    make_step("SampleConvNet", what, batch=2, K=2)()


def test_measure_in_process_and_errors_become_rows() -> None:
    row = measure(Config("MLP", 2, 1, "gsm_ghost"), steps=2, warmup=1, threads=1)
    assert row["n"] == 2 and row["ratio"] > 0 and row["peak_mb"] >= row["rss0_mb"] > 0
    # a short step goes on being timed until min_seconds have passed, but no further than max_steps
    capped = measure(Config("MLP", 2, 1, "gsm_ghost"), steps=2, warmup=0, threads=1, min_seconds=60, max_steps=7)
    assert capped["n"] == 7
    timed = measure(Config("MLP", 2, 1, "gsm_ghost"), steps=2, warmup=0, threads=1, min_seconds=0.2, max_steps=10**6)
    # medians times n: a few slow steps on a loaded machine (the quick loop runs two workers) can take much
    # of the 200 ms, so only a quarter of it is asserted
    assert timed["n"] > 2 and (timed["median_ms"] + timed["ref_median_ms"]) * timed["n"] >= 0.25 * 200
    with pytest.raises(ValueError, match="configuration 'dpsgd_jax' is unknown"):
        make_step("MLP", "dpsgd_jax", 2)
    bad = {"model": "MLP", "batch": 2, "K": 1, "what": "dpsgd_jax", "error": "ValueError: unknown"}
    assert "ERROR" in results_table([bad, row])


def test_reports() -> None:
    def row(what: str, ratio: float, K: int = 1, peak: float = 100.0) -> dict:
        return {
            "model": "M",
            "batch": 2,
            "K": K,
            "what": what,
            "median_ms": ratio,
            "min_ms": ratio,
            "ratio": ratio,
            "peak_mb": peak,
            "rss0_mb": 50.0,
            "n": 10,
        }

    rows = [
        row("nonprivate", 1.0),
        row("dpsgd_ghost", 1.2),
        row("opacus_dpsgd_hooks", 2.4),
        row("opacus_dpsgd_ghost", 3.0),
        row("gsm_hooks", 2.0, peak=120),
        row("nonprivate", 1.0, K=4, peak=110),
        row("gsm_hooks", 1.1, K=4, peak=135),
    ]
    assert "| M | 2 | DP-SGD step, best mode each | dpsgd_ghost (1.20) | dpsgd_hooks (2.40) | 0.50 |" in opacus_table(
        rows
    )
    assert "| M | 2 | 4 | gsm_hooks | 1.10 | 25.0 | 1.25 |" in multiplicity_table(rows)


def test_the_results_table_prints_the_reference_each_ratio_uses() -> None:
    """A 169.6 ms row at x2.32 next to a 143.6 ms non-private row: the table shows the 73.1 ms it divided by."""
    common = {"model": "M", "batch": 2, "K": 1, "peak_mb": 100.0, "rss0_mb": 50.0, "n": 10}
    rows = [
        {**common, "what": "nonprivate", "median_ms": 143.6, "min_ms": 140.0, "ref_median_ms": 143.6, "ratio": 1.0},
        {**common, "what": "dpsgd_hooks", "median_ms": 169.6, "min_ms": 165.0, "ref_median_ms": 73.1, "ratio": 2.32},
    ]
    table = results_table(rows)
    assert "non-private ref. median ms (same process)" in table.splitlines()[0]
    assert "| M | 2 | 1 | dpsgd_hooks | 169.6 | 165.0 | 73.1 | ×2.32 |" in table
    assert "| M | 2 | 1 | nonprivate | 143.6 | 140.0 | 143.6 | ×1.00 |" in table
    assert "timed in the same process" in table.splitlines()[-1]


@pytest.mark.slow  # times steps in fresh processes
def test_memory_benchmark_measures_every_k_in_its_own_processes() -> None:
    from dpnotebook.benchmarks.memory import run, summary

    rows = run("ghost", 2, [1, 2], repeats=1)
    assert [r["K"] for r in rows] == [1, 2]
    assert all(r["plain_peak_mb"] > 50 and r["private_peak_mb"] > 50 for r in rows)
    assert summary(rows).startswith("K=2")


OPACUS_CONFIGS = sorted(
    {
        c.what
        for c in plan(["MLP"], [2], modes=["hooks"], kinds=["gsm", "dpsgd"], ks=[1], k_batch=2, opacus=True)
        if c.what.startswith("opacus_")
    }
)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # Opacus' hooks on an input that needs no grad
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("what", OPACUS_CONFIGS)
def test_the_opacus_side_of_the_comparison_runs_on_every_model(name: str, what: str) -> None:
    model, x, y, loss = build(name, 3, flavour="opacus")
    before = [p.detach().clone() for p in model.parameters()]
    _, kind, mode = what.split("_")
    opacus_step(model, kind, mode, x, y, loss, batch=3)()
    if kind == "gsm":  # Opacus' per-sample gradients sit on the parameters
        assert all(p.grad_sample.shape == (3, *p.shape) for p in model.parameters() if p.requires_grad)
    else:  # make_private's step moved every parameter
        assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_the_opacus_step_takes_a_loss_over_tokens(mode: str) -> None:
    """A loss that is no ``nn.CrossEntropyLoss`` (the mean over every token) becomes a per-row criterion
    for Opacus' ghost mode; the step moves every parameter."""
    from dpnotebook.benchmarks.steps import _RowLoss
    from dpnotebook.fine_tuning import token_cross_entropy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    tokens, targets = torch.randint(0, 10, (3, 5)), torch.randint(0, 10, (3, 5))
    before = [p.detach().clone() for p in model.parameters()]
    opacus_step(model, "dpsgd", mode, tokens, targets, token_cross_entropy, batch=3)()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    criterion, logits = _RowLoss(token_cross_entropy), torch.randn(3, 5, 10)
    criterion.reduction = "none"  # what Opacus' ghost mode sets
    per_row = criterion(logits, targets)
    assert per_row.shape == (3,) and torch.allclose(per_row.mean(), token_cross_entropy(logits, targets))
