"""The apps built on the runtime and its testing kit: the reference worker, the multi-device and
Ray fleet drivers, and the README's example. Nothing in the runtime imports them."""
