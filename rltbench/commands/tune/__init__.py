"""`rltbench tune`: launch configurations measured on this GPU, written to its tuned-config file
(cli.py: the command; kernels.py and attention.py: the measurements; select.py: the choice)."""
