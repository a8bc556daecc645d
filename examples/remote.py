"""Remote functions in five lines. Run `sluice up` in one shell, paste the export lines it prints
into another, then: python examples/remote.py"""

import sluice


@sluice.remote(packages=["requests", "numpy==1.26.0"])
def describe(values):
    import numpy
    print(f"numpy {numpy.__version__} on the worker")
    return {"mean": float(numpy.mean(values)), "max": float(numpy.max(values))}


@sluice.remote(memory="256Mi", max_memory="1Gi")
def grow(megabytes):
    blocks = [bytearray(1 << 20) for _ in range(megabytes)]
    return len(blocks)


if __name__ == "__main__":
    call = describe.spawn([3, 1, 4, 1, 5])
    print(call.get(timeout=60))
    print("\n".join(call.output))                      # e.g. "ignored numpy==1.26.0: already provided ..."
    sized = grow.spawn(400)
    print(sized.get(timeout=60), "MiB; limits went", " -> ".join(f"{x >> 20}Mi" for x in sized.limits))
    print(describe.map([[1, 2], [3, 4], [5, 6]]))
    with sluice.session(memory="512Mi") as s:
        print("session pid", s.call(__import__("os").getpid), s.call(__import__("os").getpid))
