"""``nodemedic``: the operator CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nodemedic_cli.console import console
from nodemedic_cli.fleet.commands import app as fleet_app

app = typer.Typer(help="NodeMedic: event-driven remediation of GPU training nodes.",
                  no_args_is_help=True, add_completion=False)
app.add_typer(fleet_app, name="fleet")


@app.command()
def demo(
    nodes: Annotated[int, typer.Option(
        min=6, max=32, help="Nodes in the local cluster (two 2-node jobs plus two idle nodes).")] = 6,
    scheduler: Annotated[str, typer.Option(
        help="auto: real local Slurm if it can start (root + Debian packages), else simulated.",
    )] = "auto",
) -> None:
    """Run the local end-to-end demo: deploy template.yaml into an embedded AWS, start a cluster,
    inject faults, show remediation live and print per-incident MTTD/MTTR."""
    if scheduler not in ("auto", "slurm", "simulated"):
        raise typer.BadParameter("choose auto, slurm or simulated", param_hint="--scheduler")
    import logging

    from nodemedic_cli.demo import run_demo

    logging.getLogger("moto").setLevel(logging.CRITICAL)  # failed executions are shown, not logged

    raise typer.Exit(run_demo(console, nodes=nodes, scheduler=scheduler))


@app.command()
def schema(
    write: Annotated[bool, typer.Option(help="Write events/schema/*.json instead of printing.")] = False,
    directory: Annotated[Path, typer.Option(help="Where --write puts the files.")] = Path("events/schema"),
) -> None:
    """Print (or write) the JSON Schema of the Node Health Event v1 and the Remediation Request v1."""
    from nodemedic.contracts.schema import SCHEMAS, json_schema

    for name in SCHEMAS:
        text = json.dumps(json_schema(name), indent=2, sort_keys=True) + "\n"
        if write:
            (directory / name).write_text(text)
            console.print(f"wrote {directory / name}")
        else:
            console.print_json(text)


if __name__ == "__main__":
    app()
