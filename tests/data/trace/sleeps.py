"""Never finishes on its own: for the timeout of trace_script."""

import time

time.sleep(120)
