"""Private helpers: strict bounded JSON, reusable restore buffers, the Ray worker of the executor."""
