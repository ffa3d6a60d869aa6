"""Device backends: the protocol the Bridge asks of device memory (`base`) and tinygrad's
(`tinygrad.TinygradBackend`). The test doubles, `FakeBackend` and `FaultyBackend`, are the testing
kit's (`devbridge.testing`); `devbridge.backends.fake` and `.faulty` name them here too."""
