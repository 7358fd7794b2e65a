"""Matplotlib set up once for headless use (Agg), shared by every command's plots."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

ARM_COLORS = {"torch": "#4C72B0", "exact": "#55A868", "approx": "#C44E52", "cuda": "#DD8452"}


def arm_color(arm: str) -> str:
    base = arm.split("#", 1)[0]
    return ARM_COLORS.get(base, "#8172B2")


def figure(width: float = 7.0, height: float = 4.5):
    return plt.subplots(figsize=(width, height))
