"""`courier bench`: measure scenarios against their ceilings (see BENCHMARKS.md)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from console.bench import instructions as callgrind
from console.bench import runner
from console.bench.result import ScenarioResult

from .context import FiniteFloatRange, console, database_url, dsn_option


def _table(results: list[ScenarioResult]) -> Table:
    table = Table(title="courier bench", caption="ceilings are measured in the same run; see the notes below")
    table.add_column("scenario", no_wrap=True)
    table.add_column("variant")
    table.add_column("courier", justify="right")
    table.add_column("ceiling", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("target")
    for r in results:
        target = []
        if r.target_ratio is not None:
            target.append(f"{'<=' if r.lower_is_better else '>='} {r.target_ratio:.2g}")
        if r.target_absolute is not None:
            absolute = r.target_absolute
            target.append(f">= {absolute / 1000:.0f}k/s" if absolute >= 1000 else f">= {absolute:g}/s")
        verdict = {True: ("met", "green"), False: ("missed", "red"), None: ("", "")}[r.meets_target]
        table.add_row(
            r.scenario, r.variant, _figure(r.courier.rate),
            _figure(r.ceiling.rate) if r.ceiling else "-",
            f"{r.ratio:.2f}" if r.ratio is not None else "-",
            Text(f"{', '.join(target)} {verdict[0]}".strip(), style=verdict[1]),
        )
    return table


def _figure(value: float) -> str:
    """Rates as whole numbers; small costs per message (buffers, records) with a decimal."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _notes(results: list[ScenarioResult]) -> str:
    return "\n".join(f"- {r.scenario} / {r.variant}: {r.notes} ({r.unit})" for r in results if r.notes)


def _sizes(text: str, option: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(n.replace("_", "")) for n in text.split(",")}))
    except ValueError:
        raise click.BadParameter("must be whole numbers separated by commas", param_hint=option) from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter("must be positive", param_hint=option)
    return sizes


@click.command("bench")
@click.argument("scenarios", nargs=-1, type=click.Choice(sorted(runner.SCENARIOS)))
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results to this JSON file ('-' for stdout).")
@click.option("--clients", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--seconds", type=FiniteFloatRange(1, 600), default=8, show_default=True,
              help="Length of each measured run.")
@click.option("--rounds", type=click.IntRange(1, 10), default=2, show_default=True,
              help="Alternating courier/ceiling rounds; medians are reported.")
@click.option("--depth-rows", default="10000,1000000,10000000", show_default=True,
              help="Queue sizes the depth and console scenarios grow through, comma-separated.")
@click.option("--spark-rows", default="", metavar="SIZES",
              help="Archive sizes the spark scenario also grows through, comma-separated (e.g. 100000,1000000): "
                   "read rate and analytics against SQL. Default: only its small jobs.")
@click.option("--processes", "processes", default="", metavar="COUNTS",
              help="drain-noop also measures `courier worker --processes N` for each N, comma-separated "
                   "(e.g. 1,2,4,8), each against the ceiling with N clients, with CPU cost per 1,000 messages; "
                   "http also measures enqueue and its p99 through `courier serve --processes N`.")
@click.option("--pinned-seconds", type=FiniteFloatRange(1, 3600), default=60, show_default=True,
              help="How long the horizon scenario holds a snapshot open.")
@click.option("--offered-rate", type=FiniteFloatRange(1, 100000), default=800, show_default=True,
              help="Sends per second the horizon scenario's producers offer.")
@click.option("--instructions/--no-instructions", default=None,
              help="The cost scenario also counts CPU instructions per message, Courier's and pgmq's, under "
                   "valgrind on a private PostgreSQL cluster: a few minutes more. Default: where valgrind and "
                   "PostgreSQL's server binaries are installed.")
@dsn_option
def bench(scenarios: tuple[str, ...], json_file: Path | None, clients: int, seconds: float,
          rounds: int, depth_rows: str, spark_rows: str, processes: str, pinned_seconds: float,
          offered_rate: float, instructions: bool | None) -> None:
    """Run SCENARIOS (default: all) in a scratch database on the configured server."""
    names = list(scenarios) or sorted(runner.SCENARIOS)
    if instructions and "cost" in names and (reason := callgrind.unavailable()):
        raise click.UsageError(f"--instructions: {reason}")
    sizes = _sizes(depth_rows, "--depth-rows")
    quiet = json_file is not None and str(json_file) == "-"
    with console.status("benchmarking...") as status:
        results = runner.run(names, database_url(), clients=clients, seconds=seconds, rounds=rounds,
                             options={"depth": {"sizes": sizes}, "console": {"sizes": sizes},
                                      "spark": {"sizes": _sizes(spark_rows, "--spark-rows") if spark_rows else ()},
                                      "drain-noop": {"processes": _sizes(processes, "--processes")
                                                     if processes else ()},
                                      "http": {"processes": tuple(n for n in _sizes(processes, "--processes") if n > 1)
                                               if processes else ()},
                                      "horizon": {"pinned": pinned_seconds, "rate": offered_rate},
                                      "cost": {"instructions": instructions}},
                             progress=lambda name: status.update(f"running {name}..."))
    payload = [r.as_dict() for r in results]
    if quiet:
        click.echo(json.dumps(payload, indent=2))
        return
    console.print(_table(results))
    console.print(_notes(results), highlight=False)
    if json_file is not None:
        json_file.write_text(json.dumps(payload, indent=2) + "\n")


COMMANDS = [bench]
