"""lab: the measurements around the paper's code: the benchmark and tuner (bench), the paper's
analyses by offline replay (analysis), the tasks (tasks), the scale map (scale), the reports
(figures) and the command line behind `python minibpd.py` (cli)."""
