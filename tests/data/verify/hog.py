"""A 'port' that eats memory until something stops it."""
import time

hoard = []
while True:
    hoard.append(bytearray(200 * 1024 * 1024))
    time.sleep(0.05)
