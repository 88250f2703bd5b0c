"""Load per key range, by the autosharding protocol's rules for a load report.

A report lists, per metric, ranges by their start key in strictly increasing byte
order; each range ends where the next one starts, the last one at the end of the key
space. A start key is at most the server's `max_load_balancing_resolution_bytes` long.
No range may carry more than `load_quantum_fraction` of the metric's total load unless
it cannot be narrowed: it starts at a key of the full resolution and the next range
starts at the very next key of that length (so it holds one key at that resolution).

Written from the protocol's description, independently of steady's Rust code, so that
each side checks the other.
"""

import math

# Tolerance on the quantum comparison: loads are doubles summed in different orders.
EPSILON = 1e-9


def successor(key):
    """The next byte string of the same length in byte order (None after all 0xFF)."""
    digits = bytearray(key)
    for i in reversed(range(len(digits))):
        if digits[i] != 0xFF:
            digits[i] += 1
            return bytes(digits)
        digits[i] = 0
    return None


def aggregate(loads, quantum, resolution):
    """Per-key `loads` ({bytes: float}) as `[(start, load)]` under the rules.

    Keys are cut to `resolution` bytes (keys sharing a prefix add up). Walking from the
    lowest key, each key joins the open range while that keeps the range within the
    quantum; a key over the quantum alone gets a range of its own, closed right after it
    by a range of no load (which later keys may join). After the last loaded key a range
    of no load closes the report, so that the last range's load is not taken as spread
    up to the end of the key space. Keys without load are left out.
    """
    merged = {}
    for key, load in loads.items():
        if load > 0:
            prefix = bytes(key[:resolution])
            merged[prefix] = merged.get(prefix, 0.0) + load
    total = sum(merged.values())
    limit = quantum * total
    ranges = []  # [start, load], each open to more keys unless `closed`
    closed = True
    last_key = None
    for key in sorted(merged):
        load = merged[key]
        if load > limit + EPSILON:
            if ranges and ranges[-1][0] == key:
                # The range of no load closing the previous single key starts here.
                ranges[-1][1] = load
            else:
                ranges.append([key, load])
            after = successor(key)
            if after is None:
                closed = True
            else:
                ranges.append([after, 0.0])
                closed = False
        elif not closed and ranges[-1][1] + load <= limit + EPSILON:
            ranges[-1][1] += load
        else:
            ranges.append([key, load])
            closed = False
        last_key = key
    if ranges and ranges[-1][1] > 0 and last_key is not None:
        after = successor(last_key)
        if after is not None and after != ranges[-1][0]:
            ranges.append([after, 0.0])
    return [(start, load) for start, load in ranges]


def violations(ranges, quantum, resolution):
    """The rules `ranges` (`[(start, load)]`, one metric) break, as sentences."""
    found = []
    total = 0.0
    for start, load in ranges:
        if len(start) > resolution:
            found.append(f"start key {start.hex()} is longer than {resolution} bytes")
        if not math.isfinite(load) or load < 0:
            found.append(f"range {start.hex()} has load {load}")
        else:
            total += load
    for (before, _), (after, _) in zip(ranges, ranges[1:]):
        if not before < after:
            found.append(f"start keys do not increase: {before.hex()} then {after.hex()}")
    limit = quantum * total
    for i, (start, load) in enumerate(ranges):
        if not math.isfinite(load) or load <= limit + EPSILON:
            continue
        following = ranges[i + 1][0] if i + 1 < len(ranges) else None
        single = len(start) == resolution and following is not None and following == successor(start)
        if not single:
            found.append(
                f"range {start.hex()} carries {load} of {total}, over the quantum {quantum}, "
                "and holds more than one key"
            )
    return found
