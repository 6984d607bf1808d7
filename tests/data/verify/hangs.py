"""A 'port' that never finishes its first step."""
import time

while True:
    time.sleep(1)
