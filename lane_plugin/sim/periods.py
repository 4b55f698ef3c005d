"""The lane's budget periods in the simulation: rolling them over and what each one spent (against the
ceiling and the allowance); a mixin of :class:`lane_plugin.sim.engine.Sim`."""

from __future__ import annotations

from .chains import PERIOD_EV


class BudgetPeriods:
    """The budget period bookkeeping of :class:`lane_plugin.sim.engine.Sim`."""

    def _roll(self, t: float) -> None:
        cfg = self.cfg
        if cfg.period_seconds and t >= self.period_start + cfg.period_seconds:
            self._close_period()
            self.period_start = t // cfg.period_seconds * cfg.period_seconds
            self.series_t.append(self.period_start)
            self.series_spent.append(0)

    def _close_period(self) -> None:
        cfg = self.cfg
        self.over_ceiling += max(0, self.spent - cfg.ceiling)
        self.over_allowance += max(0, self.spent - cfg.allowance)
        self.peak_period_spent = max(self.peak_period_spent, self.spent)
        key = int(self.period_start // cfg.period_seconds) if cfg.period_seconds else 0
        self.period_spent[key] = self.period_spent.get(key, 0) + self.spent
        self.spent = 0

    def _next_period(self, t: float) -> None:
        nxt = self.period_start + self.cfg.period_seconds
        if nxt <= t:
            nxt = (t // self.cfg.period_seconds + 1) * self.cfg.period_seconds
        if nxt <= self.horizon:
            self._push(nxt, PERIOD_EV)
