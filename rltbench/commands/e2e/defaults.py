"""The e2e command's workload names and defaults, apart from job.py and rate.py so that
`rltbench e2e --help` can show them without loading torch and the engine."""

BURST = "burst"
SESSION = "session"
RATE = "rate"
GPU_CONCURRENCY = "1,8,32,128"  # the burst sizes when --concurrency is not given
CPU_CONCURRENCY = "1,8"  # on CPU, where C=128 of even a tiny model takes many minutes per cell
# on CPU with an arm's kernels in the Triton interpreter (scope all, the default there), where one
# decode step of ouro-tiny takes about a second: a burst that still checks batched identity
INTERPRETER_CONCURRENCY = "1,2"
INTERPRETER_LENGTHS = (32, 8)  # input, output tokens
DEFAULT_SWEEP_RATES = 5
DEFAULT_DURATION_S = 10.0  # seconds of arrivals per rate cell when --num-prompts is not given
DEFAULT_CELL_LATENCIES = 6.0  # a sweep's cell lasts this many synchronous request latencies
MIN_CELL_REQUESTS = 10  # the fewest requests of a rate cell sized by its seconds (not --duration)
MAX_DURATION_S = 86400.0  # a day of arrivals per cell: beyond it a cell is no longer one measurement
MAX_BURSTINESS = 1e6  # gamma gaps of a larger shape are constant gaps (and numpy's draws turn to 0)
MAX_RATE = 10_000.0  # requests/s: far beyond what one model server sustains
MAX_CELL_REQUESTS = 1_000_000  # requests of one rate cell (--num-prompts, or rate x --duration)
