"""The ground floor: strict bounded JSON, digests, core counts, reusable restore buffers; imports nothing above errors."""
