"""Aggregation, time-to-target tables, figures and the HTML report over ``results/runs/``."""
