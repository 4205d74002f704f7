"""The Tether benchmark suite: Tether beside its Python peers and a bare redis-py floor.

Run it with ``python3 bench/run.py`` (see bench/README.md). This package is imported by the
driver and by every worker process, in every system's own virtual environment, so it must not
import anything but the standard library at package level.
"""
