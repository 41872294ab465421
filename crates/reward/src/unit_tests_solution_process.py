import json as _json, os as _os, sys as _sys
def _stoke_child():
    entry_point = _sys.argv[1]
    requests = _os.fdopen(int(_sys.argv[2]), "r")
    replies = _os.fdopen(int(_sys.argv[3]), "w")
    def send(message):
        replies.write(_json.dumps(message) + "\n")
        replies.flush()
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
        raise TypeError("result of type %s is not a builtin data type" % kind.__name__)
    def decode(data):
        kind = type(data)
        if data is None or kind is bool or kind is str:
            return data
        if kind is list:
            return [decode(v) for v in data]
        (tag, body), = data.items()
        if tag == "i":
            return int(body, 16)
        if tag == "f":
            return float.fromhex(body)
        if tag == "c":
            return complex(float.fromhex(body[0]), float.fromhex(body[1]))
        if tag == "b":
            return bytes.fromhex(body)
        if tag == "t":
            return tuple(decode(v) for v in body)
        if tag == "s":
            return set(decode(v) for v in body)
        if tag == "z":
            return frozenset(decode(v) for v in body)
        return {decode(k): decode(v) for k, v in body}
    namespace = {"__name__": "solution"}
    try:
        with open("solution.py") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec"), namespace)
        function = namespace[entry_point]
    except BaseException as error:
        send({"load_error": type(error).__name__})
        return
    send({"ready": True})
    for line in requests:
        call = _json.loads(line)
        try:
            result = function(*decode(call["a"]), **decode(call["k"]))
            reply = {"r": encode(result)}
        except BaseException as error:
            reply = {"x": type(error).__name__}
        send(reply)
_stoke_child()
