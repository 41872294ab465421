import ast as _ast, builtins as _builtins, json as _json, linecache as _linecache, os as _os, signal as _signal, subprocess as _subprocess, sys as _sys, warnings as _warnings
# The trusted judge. It runs as `python3 -I` (isolated mode: the work dir, which the solution
# process can write, is not on sys.path), and everything it imports is imported above, before the
# solution process exists. The path is cleaned again below in case the interpreter ignored -I.
def _stoke_main():
    work_dir = _os.path.realpath(_os.getcwd())
    def untrusted(entry):
        if not entry or not _os.path.isabs(entry):
            return True
        real = _os.path.realpath(entry)
        return real == work_dir or real.startswith(work_dir + _os.sep)
    _sys.path[:] = [entry for entry in _sys.path if not untrusted(entry)]
    _sys.path_importer_cache.clear()
    # No warning is ever shown: showing one reads source lines (linecache) and may import.
    _warnings.simplefilter("ignore")
    # SIGINT would raise KeyboardInterrupt wherever the judge is; the solution shares its uid.
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    chunks = []
    while True:
        chunk = _os.read(0, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    nonce = b"".join(chunks).decode().strip()
    try:
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except BaseException:
        pass
    entry_point = _sys.argv[1]
    def report(passed, total, status):
        # One line, whatever a solution put in its load error.
        status = "".join(c for c in status if c.isalnum() or c in "_:.-")[:120]
        _os.write(1, ("\n%s %d %d %s\n" % (nonce, passed, total, status)).encode())
    with open("tests.py") as f:
        tests = f.read()
    try:
        with open("prompt.py") as f:
            prompt = f.read()
    except OSError:
        prompt = ""
    for name in ("tests.py", "prompt.py"):
        try:
            _os.remove(name)
        except OSError:
            pass
    # Everything trusted is compiled before the solution starts, under names that are not files
    # (so no source line is ever looked up in the work dir).
    try:
        tree = _ast.parse(tests, "<tests>")
    except SyntaxError:
        report(0, 0, "tests_syntax_error")
        return
    passed_sites, failed_sites = set(), set()
    class Rewrite(_ast.NodeTransformer):
        sites = 0
        def visit_Assert(self, node):
            site = Rewrite.sites
            Rewrite.sites += 1
            wrapper = _ast.parse(
                "try:\n    pass\n    _stoke_ok_(%d)\nexcept BaseException:\n    _stoke_bad_(%d)\n" % (site, site)
            ).body[0]
            wrapper.body[0] = node
            return wrapper
    tree = _ast.fix_missing_locations(Rewrite().visit(tree))
    total = Rewrite.sites
    tests_code = compile(tree, "<tests>", "exec")
    try:
        prompt_code = compile(prompt, "<prompt>", "exec") if prompt else None
    except BaseException:
        prompt_code = None
    request_read, request_write = _os.pipe()
    reply_read, reply_write = _os.pipe()
    flags = [f for f, on in (("-S", _sys.flags.no_site), ("-E", _sys.flags.ignore_environment), ("-B", _sys.flags.dont_write_bytecode)) if on]
    # A process group of its own, so the solution's children die with it (`process_group`
    # keeps subprocess's vfork path; Python before 3.11 only has preexec_fn).
    group = {"process_group": 0} if _sys.version_info >= (3, 11) else {"preexec_fn": _os.setpgrp}
    child = _subprocess.Popen(
        [_sys.executable] + flags + ["child.py", entry_point, str(request_read), str(reply_write)],
        stdin=_subprocess.DEVNULL, stdout=2, pass_fds=(request_read, reply_write), close_fds=True,
        **group,
    )
    _os.close(request_read)
    _os.close(reply_write)
    requests = _os.fdopen(request_write, "w")
    replies = _os.fdopen(reply_read, "r")
    def stop_solution():
        for kill in (lambda: _os.killpg(child.pid, _signal.SIGKILL), child.kill):
            try:
                kill()
            except OSError:
                pass
        child.wait()
    def receive():
        line = replies.readline(1 << 26)
        if not line.endswith("\n"):
            raise RuntimeError("the solution process ended")
        return _json.loads(line)
    def encode(value, depth=0):
        kind = type(value)
        if depth > 100:
            raise TypeError("nested too deeply")
        if value is None or kind is bool or kind is str:
            return value
        if kind is int:
            return {"i": hex(value)}
        if kind is float:
            return {"f": float.hex(value)}
        if kind is complex:
            return {"c": [float.hex(value.real), float.hex(value.imag)]}
        if kind is bytes:
            return {"b": value.hex()}
        if kind is list:
            return [encode(v, depth + 1) for v in value]
        if kind is tuple:
            return {"t": [encode(v, depth + 1) for v in value]}
        if kind is set:
            return {"s": [encode(v, depth + 1) for v in value]}
        if kind is frozenset:
            return {"z": [encode(v, depth + 1) for v in value]}
        if kind is dict:
            return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
        raise TypeError("a value of type %s cannot cross to the solution process" % kind.__name__)
    def decode(data, depth=0):
        kind = type(data)
        if depth > 100:
            raise TypeError("nested too deeply")
        if data is None or kind is bool or kind is str:
            return data
        if kind is list:
            return [decode(v, depth + 1) for v in data]
        if kind is not dict or len(data) != 1:
            raise TypeError("malformed value from the solution process")
        (tag, body), = data.items()
        if tag == "i" and type(body) is str:
            return int(body, 16)
        if tag == "f" and type(body) is str:
            return float.fromhex(body)
        if tag == "c" and type(body) is list and len(body) == 2 and all(type(p) is str for p in body):
            return complex(float.fromhex(body[0]), float.fromhex(body[1]))
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is not list:
            raise TypeError("malformed value from the solution process")
        if tag == "t":
            return tuple(decode(v, depth + 1) for v in body)
        if tag == "s":
            return set(decode(v, depth + 1) for v in body)
        if tag == "z":
            return frozenset(decode(v, depth + 1) for v in body)
        if tag == "d":
            result = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise TypeError("malformed value from the solution process")
                result[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            return result
        raise TypeError("malformed value from the solution process")
    try:
        hello = receive()
    except BaseException:
        stop_solution()
        report(0, total, "exited_while_loading")
        return
    if hello != {"ready": True}:
        status = hello.get("load_error") if type(hello) is dict else None
        stop_solution()
        report(0, total, "load_error:" + (status if type(status) is str else "malformed")[:100])
        return
    # An exception from the solution arrives as data: its builtin class by name, so tests can
    # check for ValueError and the like. Classes that drive iteration in the judge's own code
    # (StopIteration ends `all(map(candidate, ...))` early and passes it) become RuntimeError,
    # as PEP 479 does for generators.
    control_flow = (StopIteration, StopAsyncIteration)
    raisable = {
        name: value for name, value in vars(_builtins).items()
        if type(value) is type and issubclass(value, Exception) and not issubclass(value, control_flow)
    }
    def solution_error(name):
        message = "raised in the solution: %s" % (name if type(name) is str else "?")[:100]
        kind = raisable.get(name, RuntimeError) if type(name) is str else RuntimeError
        try:
            error = kind(message)
        except BaseException:
            error = RuntimeError(message)
        if not isinstance(error, kind) or isinstance(error, control_flow):
            error = RuntimeError(message)
        return error
    def candidate(*args, **kwargs):
        requests.write(_json.dumps({"a": encode(list(args)), "k": encode(kwargs)}) + "\n")
        requests.flush()
        reply = receive()
        if type(reply) is dict and "r" in reply:
            return decode(reply["r"])
        raise solution_error(reply.get("x") if type(reply) is dict else None)
    namespace = {"__name__": "tests", "__builtins__": _builtins}
    if prompt_code is not None:
        try:
            exec(prompt_code, namespace)
        except BaseException:
            pass
    namespace["_stoke_ok_"] = passed_sites.add
    namespace["_stoke_bad_"] = failed_sites.add
    try:
        exec(tests_code, namespace)
        check = namespace["check"]
    except BaseException as error:
        stop_solution()
        report(0, total, "setup_error:" + type(error).__name__)
        return
    namespace[entry_point] = candidate
    status = "ok"
    try:
        check(candidate)
    except BaseException as error:
        status = "check_raised:" + type(error).__name__
    passed = len(passed_sites - failed_sites)
    # The solution is gone before the nonce is ever written.
    stop_solution()
    report(passed, total, status)
_stoke_main()
