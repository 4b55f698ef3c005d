"""The tables of a lane's sliding windows: each admission's charge to the provider's rate limiter, and the lane's
limits over requests, input and output tokens with their charges (lane_plugin.ledger.rates, .limits)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import BigInteger, CheckConstraint, Index
from sqlmodel import Field, SQLModel


class RateCharge(SQLModel, table=True):
    """What one admission charged the provider's rate limiter, while it is in the sliding window."""

    __tablename__ = "rate_charge"
    __table_args__ = (Index("ix_rate_charge_lane_at", "lane", "at"),)

    job_id: str = Field(primary_key=True, max_length=64)
    attempt: int = Field(primary_key=True)
    lane: str = Field(max_length=64)
    at: float  # counted from here: the grant (+ send slack), moved to the pick-up
    cost: int = Field(sa_type=BigInteger)
    sent: bool = Field(default=True, sa_column_kwargs={"server_default": sa.true()})  # false: handed, not picked up


class LaneLimit(SQLModel, table=True):
    """One of a lane's limits over ``requests``, ``input_tokens`` or ``output_tokens`` (policy.limits), with
    its sliding window's counter, kept as ``lane.window_used`` is for the ``tokens`` limit."""

    __tablename__ = "lane_limit"
    __table_args__ = (CheckConstraint("amount > 0 and window_seconds > 0 and used >= 0", name="ck_lane_limit"),)

    lane: str = Field(primary_key=True, max_length=64)
    unit: str = Field(primary_key=True, max_length=16)
    amount: int = Field(sa_type=BigInteger)
    window_seconds: float
    used: int = Field(
        default=0, sa_type=BigInteger
    )  # the cost of the limit_charge rows of this unit still in its window
    window_start: float = Field(default=0.0)  # charges at or before this were pruned from the window


class LimitCharge(SQLModel, table=True):
    """What one admission counted against one of its lane's limits, while it is in that limit's window."""

    __tablename__ = "limit_charge"
    __table_args__ = (Index("ix_limit_charge_lane_unit_at", "lane", "unit", "at"),)

    job_id: str = Field(primary_key=True, max_length=64)
    attempt: int = Field(primary_key=True)
    unit: str = Field(primary_key=True, max_length=16)
    lane: str = Field(max_length=64)
    at: float
    cost: int = Field(sa_type=BigInteger)
    sent: bool = Field(default=True, sa_column_kwargs={"server_default": sa.true()})
