"""``sluice deploy render|compose|apply|diff``: the catalog as Kubernetes manifests (or a compose
file), and those manifests against a cluster."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from sluice.cli.common import app_option, load_app
from sluice.deploy import alerts, kube_client
from sluice.deploy.compose import render_compose
from sluice.deploy.manifests import Manifest, RenderOptions, render, to_yaml

#: The alert rules as a plain Prometheus rules file, beside the objects (``render --out``).
RULES_FILE = "sluice-rules.yml"


def _rendered(options: RenderOptions) -> dict[str, list[Manifest]]:
    return render(load_app(options.app).catalog, options)


_render_options = [
    app_option(
        "Module holding the sluice App: its catalog sizes the workers, and the pods run it.", default="sluice.demo"
    ),
    click.option("--namespace", default="sluice", show_default=True),
    click.option("--image", default=RenderOptions.image, show_default=True, help="Image with your app installed."),
    click.option(
        "--grace",
        default=RenderOptions.grace_seconds,
        show_default=True,
        help="Seconds a worker pod gets to finish running tasks on shutdown (warm shutdown).",
    ),
    click.option(
        "--sentinel",
        is_flag=True,
        help="Redis as three nodes with Sentinel (a failover in seconds when a node dies) instead of one.",
    ),
]


def render_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options every renderer takes, handed to ``command`` as one ``options: RenderOptions``."""

    @functools.wraps(command)
    def with_options(app_name: str, namespace: str, image: str, grace: int, sentinel: bool, **rest: Any) -> Any:
        return command(
            RenderOptions(app=app_name, namespace=namespace, image=image, grace_seconds=grace, redis_sentinel=sentinel),
            **rest,
        )

    for option in reversed(_render_options):
        with_options = option(with_options)
    return with_options


@click.group()
def deploy() -> None:
    """Kubernetes manifests for the catalog: render them, diff them against a cluster, apply them."""


@deploy.command("render")
@render_options
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write sluice.yaml, keda.yaml, autoscaler.yaml, monitoring.yaml and the alert rules as a "
    "plain Prometheus rules file (sluice-rules.yml) here (default: the objects to stdout).",
)
def render_command(options: RenderOptions, out: Path | None) -> None:
    """Render the Namespace, Redis, Flower, a worker Deployment per class, KEDA ScaledObjects, the
    built-in autoscaler (use either keda.yaml or autoscaler.yaml), and the alert rules (a
    PrometheusRule in monitoring.yaml; with --out, also a plain rules file)."""
    files = _rendered(options)
    if out is None:
        click.echo(to_yaml([doc for docs in files.values() for doc in docs]), nl=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, docs in files.items():
        (out / name).write_text(to_yaml(docs))
        click.echo(f"wrote {out / name} ({len(docs)} objects)")
    (out / RULES_FILE).write_text(to_yaml([alerts.rules_file()]))
    click.echo(f"wrote {out / RULES_FILE} (alert rules for Prometheus's rule_files)")


@deploy.command("compose")
@render_options
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the file here (default: stdout).",
)
def compose_command(options: RenderOptions, out: Path | None) -> None:
    """Render docker-compose.yml: the same topology for development (gpu workers in the gpu profile)."""
    if options.redis_sentinel:
        raise click.UsageError("--sentinel is for Kubernetes: compose runs one Redis, for development")
    text = to_yaml([render_compose(load_app(options.app).catalog, options)])
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {out}")


@deploy.command("apply")
@render_options
@click.option(
    "--keda/--builtin-autoscaler",
    default=True,
    show_default=True,
    help="Scale with KEDA ScaledObjects, or with sluice's own autoscaler Deployment.",
)
@click.option("--dry-run", is_flag=True, help="Have the API server validate everything without persisting it.")
def apply_command(options: RenderOptions, keda: bool, dry_run: bool) -> None:
    """Create or update every object (server-side apply: running it twice changes nothing)."""
    api = kube_client.connect("sluice deploy apply")
    from sluice.deploy import kube  # the kubernetes extra, once connect has said whether it is installed

    files = _rendered(options)
    docs = files["sluice.yaml"] + (files["keda.yaml"] if keda else files["autoscaler.yaml"])
    with kube_client.reaching(api):
        for name, state in kube.apply(api, docs, dry_run=dry_run):
            click.echo(f"{name} {state}")


@deploy.command("diff")
@render_options
@click.option("--keda/--builtin-autoscaler", default=True, show_default=True)
def diff_command(options: RenderOptions, keda: bool) -> None:
    """Show what `apply` would change, as a unified diff per object (exit 1 when there is any;
    69 when there is no cluster to compare with)."""
    api = kube_client.connect("sluice deploy diff")
    from sluice.deploy import kube  # the kubernetes extra, once connect has said whether it is installed

    files = _rendered(options)
    with kube_client.reaching(api):
        text = kube.diff(api, files["sluice.yaml"] + (files["keda.yaml"] if keda else files["autoscaler.yaml"]))
    click.echo(text, nl=False)
    sys.exit(1 if text else 0)
