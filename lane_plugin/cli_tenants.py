"""``lane tenants [LANE]`` and ``lane tenants set LANE TENANT``: who shares a lane, their weights and budgets.

A lane's tenants share it fairly by tokens (:mod:`lane_plugin.policy.fairness`): the backlogged tenant with
the least weighted service goes next. A weight is a share when backlogged; a ceiling is a budget inside
the lane's (its spent plus its leased estimates never pass it).
"""

from __future__ import annotations

from typing import Optional

import typer
from typer.core import TyperGroup

from .cli_common import JSON, PLAIN, WIDE, ledger, print_json, print_table


class _LaneOrCommand(TyperGroup):
    """``lane tenants [LANE]`` beside ``lane tenants set ...``: a first word naming a subcommand is that
    subcommand (the optional LANE would otherwise swallow it), anything else is the LANE."""

    def get_params(self, ctx):  # type: ignore[no-untyped-def]
        """Without the LANE for a subcommand: click puts a group's arguments into its subcommand's usage line
        (it calls this with the subcommand's context), which read ``lane tenants [lane] set ...``."""
        params = super().get_params(ctx)
        return params if ctx.command is self and not ctx.invoked_subcommand else [p for p in params if p.name != "lane"]

    def collect_usage_pieces(self, ctx):  # type: ignore[no-untyped-def]
        """``[OPTIONS] [LANE] | set {LANE} {TENANT} [OPTIONS]``: the two forms, not ``[LANE] COMMAND [ARGS]...``."""
        pieces = [p for p in super().collect_usage_pieces(ctx) if p != self.subcommand_metavar]
        for name, command in self.commands.items():
            args = [p for p in command.collect_usage_pieces(ctx) if p != "[OPTIONS]"]
            pieces += ["|", name, *args, "[OPTIONS]"]
        return pieces

    def parse_args(self, ctx, args):  # type: ignore[no-untyped-def]
        if args and args[0] in self.commands and not [a for a in args[1:] if not a.startswith("-") or a == "--help"]:
            from .errors import InvalidInput  # `lane tenants set` alone: a lane of that name is listed with --lane

            raise InvalidInput(
                "lane",
                args[0],
                f"`lane tenants {args[0]}` needs a LANE and a TENANT (lane tenants {args[0]} LANE TENANT --weight W); "
                f"to list the tenants of a lane named '{args[0]}': lane tenants --lane {args[0]}",
            )
        if args and args[0] in self.commands:
            params = self.params
            self.params = [p for p in params if p.name != "lane"]
            try:
                rest = super().parse_args(ctx, args)
            finally:
                self.params = params
            ctx.params.setdefault("lane", None)
            return rest
        ctx.allow_interspersed_args = True  # no subcommand: `lane tenants free --json` as `lane tenants --json free`
        return super().parse_args(ctx, args)


tenants_app = typer.Typer(
    cls=_LaneOrCommand,
    help="Show a lane's tenants (weight, budget, spent, reserved, waiting, share of the last hour), or set one's "
    "weight or budget.",
    invoke_without_command=True,
    **PLAIN,
)
TENANT_COLUMNS = ["lane", "tenant", "weight", "ceiling", "period", "spent", "reserved", "waiting", "share 1h"]


@tenants_app.callback()
def tenants(
    ctx: typer.Context,
    lane: Optional[str] = typer.Argument(
        None, metavar="LANE", help="Only this lane's tenants (default: every lane's)."
    ),
    lane_option: Optional[str] = typer.Option(
        None, "--lane", help="The same as LANE (for a lane named like a subcommand: --lane set)."
    ),
    as_json: bool = JSON,
    wide: bool = WIDE,
):
    """Each tenant: weight, ceiling (and its period), spent, reserved, waiting, and its share of the lane's
    tokens settled over the last hour."""
    if ctx.invoked_subcommand:
        return
    if lane is not None and lane_option is not None and lane != lane_option:
        from .errors import InvalidInput

        raise InvalidInput("lane", lane_option, f"LANE '{lane}' and --lane '{lane_option}' name two lanes")
    lane = lane if lane is not None else lane_option
    rows = ledger(create=False).tenants(lane)
    if as_json:
        print_json(rows)
        return
    table = [
        [
            t["lane"],
            t["tenant"],
            f"{t['weight']:g}",
            "-" if t["ceiling"] is None else f"{t['ceiling']:,}",
            t["period"],
            f"{t['spent']:,}",
            f"{t['reserved']:,}",
            t["waiting"],
            "-" if t["share_1h"] is None else f"{t['share_1h']:.0%}",
        ]
        for t in rows
    ]
    print_table(
        "tenants",
        TENANT_COLUMNS,
        table,
        wide=wide,
        right={"weight", "ceiling", "spent", "reserved", "waiting", "share 1h"},
    )


@tenants_app.command("set")
def tenants_set(
    lane: str = typer.Argument(..., metavar="LANE", help="The lane (it must exist)."),
    tenant: str = typer.Argument(
        ..., metavar="TENANT", help="The tenant (a name its jobs are not submitted with is refused unless --create)."
    ),
    create: bool = typer.Option(False, "--create", help="Add the tenant if the lane has none of that name yet."),
    weight: Optional[float] = typer.Option(
        None, help="Its share when backlogged, relative to the others (1 to 1000; default 1)."
    ),
    ceiling: Optional[int] = typer.Option(None, help="Its budget inside the lane's: spent + reserved never pass it."),
    no_ceiling: bool = typer.Option(False, "--no-ceiling", help="Remove its budget."),
    period: Optional[str] = typer.Option(None, help="When its spent resets: none, daily or monthly (UTC)."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Lower the ceiling even under what the tenant already "
        "admitted this period (its jobs then wait until its next reset).",
    ),
    as_json: bool = JSON,
):
    """Give a tenant a weight or a budget. For example: lane tenants set free interactive --create --weight 4
    (--create: a tenant no job has been submitted as yet)."""
    from .errors import InvalidInput

    if no_ceiling and ceiling is not None:
        raise InvalidInput("ceiling", ceiling, "--ceiling and --no-ceiling contradict each other")
    t = ledger().set_tenant(
        lane, tenant, weight=weight, ceiling=ceiling, no_ceiling=no_ceiling, period=period, create=create, force=force
    )
    if as_json:
        print_json(t)
        return
    period = "no period: never resets" if t["period"] == "none" else t["period"]
    budget = (
        f"no ceiling (period {period}, for a ceiling set later)"
        if t["ceiling"] is None
        else f"ceiling {t['ceiling']:,} ({period}), spent {t['spent']:,}"
    )
    typer.echo(f"tenant {t['tenant']} of lane {t['lane']}: weight {t['weight']:g}, {budget}")


__all__ = ["tenants_app"]
