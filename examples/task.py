import argparse

def _parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("-n", "--n", type=int, default=10)
    return p.parse_args(argv)

def plan():
    """Yield tasks. Each must have an 'id'."""
    args = _parse_args()
    for i in range(args.n):
        yield {"id": f"t-{i}", "x": i}

def execute(item):
    """Process one task. Returns a dict."""
    return {"x2": item["x"] * 2}

# Works as a plain script too
if __name__ == "__main__":
    for xx in plan():
        print(execute(xx))
