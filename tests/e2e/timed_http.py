"""The openai SDK's HTTP transport, timed: the client's own clock for TTFT starts when the
request goes to the wire and stops when the bytes of the first content chunk arrive (the SDK's
Python work, building the request and parsing events, is the client's time, not the server's
or the proxy's). Shared by the end-to-end clients."""
import json, time

try:  # openai 3.x ships its transport as httpx2; 1.x and 2.x use httpx
    import httpx2 as httpx
except ImportError:
    import httpx

sent_at = [0.0]
arrivals = []  # (perf_counter, bytes) of each read of the current response body


class TimedStream(httpx.SyncByteStream):
    """Notes when each piece of the body reached the client, before the SDK parses it."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        for chunk in self.inner:
            arrivals.append((time.perf_counter(), chunk))
            yield chunk

    def close(self):
        self.inner.close()


class TimedTransport(httpx.HTTPTransport):
    def handle_request(self, request):
        arrivals.clear()
        sent_at[0] = time.perf_counter()
        resp = super().handle_request(request)
        resp.stream = TimedStream(resp.stream)
        return resp


def first_content_arrival():
    """When the bytes of the first event carrying generated text arrived (None: never)."""
    buf = b""
    for t, chunk in arrivals:
        buf += chunk
        for event in buf.split(b"\n\n")[:-1]:
            for line in event.split(b"\n"):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                try:
                    c = json.loads(line[6:])["choices"][0]
                except (ValueError, KeyError, IndexError):
                    continue
                if (c.get("delta") or {}).get("content") or c.get("text"):
                    return t
    return None
