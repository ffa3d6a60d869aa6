"""Reference model and bounded model checker of the allocation lifecycle.

Reserved for the reference model (tiny, obviously right) that the stateful
tests run in lockstep with the Bridge, and the exhaustive bounded checker.
"""
