# sluice - tests/integration/h2lib.py: a raw HTTP/2 client for the HTTP/2
# tests (test_http2.py, test_http2_abuse.py), on python3-h2 over a plain
# socket (prior knowledge): frames exactly as a test wants them, the events
# that come back, and hand-made frames (hyperframe) for what h2 itself
# refuses to send. Every read is bounded in time.

import socket
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import ContinuationFrame, HeadersFrame


class _Streams:
    """What both clients keep per stream, and their bounded waits. A
    subclass sets .streams = {}, .closed and defines pump()."""

    def stream(self, sid):
        return self.streams.setdefault(sid, {"headers": [], "data": b"", "reset": None,
                                             "ended": False})

    def wait(self, until, timeout_s=10.0):
        """Pumps until until(self) is true, the peer closes, or timeout_s."""
        deadline = time.monotonic() + timeout_s
        while not until(self) and not self.closed and time.monotonic() < deadline:
            self.pump()
        return until(self)

    def response(self, sid, timeout_s=10.0):
        """(final status or None, its fields as a dict, body, reset code or
        None) once the stream ended or was reset, or timeout_s passed."""
        st = self.stream(sid)
        self.wait(lambda c: st["ended"] or st["reset"] is not None, timeout_s)
        finals = [h for h in st["headers"] if not h.get(":status", "2").startswith("1")]
        head = finals[0] if finals else {}
        return (int(head[":status"]) if ":status" in head else None, head, st["data"],
                st["reset"])


class H2Conn(_Streams):
    """One HTTP/2 connection to 127.0.0.1:port, preface and SETTINGS sent."""

    def __init__(self, port, timeout_s=5.0, settings=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8", validate_outbound_headers=False,
            normalize_outbound_headers=False, validate_inbound_headers=False))
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.flush()
        self.streams = {}       # id -> {"headers": [...], "data": b"", "reset": code, "ended"}
        self.goaway = None      # the ConnectionTerminated event
        self.closed = False

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def send_raw(self, data):
        self.sock.sendall(data)

    def request(self, path="/", method="GET", authority="localhost", headers=(), body=None,
                end=True):
        """Sends a request; returns its stream id. body None and end: no DATA."""
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":scheme", "http"), (":path", path)]
        if authority is not None:
            hdrs.insert(2, (":authority", authority))
        hdrs += list(headers)
        self.conn.send_headers(sid, hdrs, end_stream=end and body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end)
        self.flush()
        self.stream(sid)
        return sid

    def pump(self, timeout_s=0.2):
        """Reads what comes within timeout_s (or until the peer closes)."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.closed = True
            return
        for ev in events:
            sid = getattr(ev, "stream_id", None)
            if isinstance(ev, (h2.events.ResponseReceived, h2.events.InformationalResponseReceived,
                               h2.events.TrailersReceived)):
                self.stream(sid)["headers"].append(dict(ev.headers))
            elif isinstance(ev, h2.events.DataReceived):
                self.stream(sid)["data"] += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            elif isinstance(ev, h2.events.StreamEnded):
                self.stream(sid)["ended"] = True
            elif isinstance(ev, h2.events.StreamReset):
                self.stream(sid)["reset"] = ev.error_code
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = ev
        try:
            self.flush()
        except OSError:
            self.closed = True

    def close(self):
        self.sock.close()


def headers_frame(sid, block, end_headers=True, end_stream=True):
    """A HEADERS frame carrying an already encoded header block."""
    f = HeadersFrame(sid)
    f.data = block
    if end_headers:
        f.flags.add("END_HEADERS")
    if end_stream:
        f.flags.add("END_STREAM")
    return f.serialize()


def continuation_frame(sid, block, end_headers=False):
    f = ContinuationFrame(sid)
    f.data = block
    if end_headers:
        f.flags.add("END_HEADERS")
    return f.serialize()


class RawH2(_Streams):
    """HTTP/2 by hand, for frames no well-behaved library sends (floods,
    bombs, resets by the thousand): frames out as built, frames in parsed
    with hyperframe, header blocks with our own HPACK state."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def __init__(self, port, timeout_s=5.0, settings=None):
        import hpack
        from hyperframe.frame import SettingsFrame
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.dec.max_header_list_size = 1 << 30
        self.dec.max_allowed_table_size = 1 << 16
        sf = SettingsFrame(0)
        for k, v in (settings or {}).items():
            sf.settings[k] = v
        self.sock.sendall(self.PREFACE + sf.serialize())
        self.buf = b""
        self.next_sid = 1
        self.streams = {}
        self.goaway = None          # (error code, last stream id)
        self.closed = False

    def block(self, path, method="GET", extra=()):
        return self.enc.encode([(":method", method), (":scheme", "http"),
                                (":authority", "localhost"), (":path", path), *extra])

    def send(self, data):
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.closed = True
            return False

    def request(self, path, method="GET", extra=(), end=True):
        sid = self.next_sid
        self.next_sid += 2
        self.stream(sid)
        self.send(headers_frame(sid, self.block(path, method, extra), end_stream=end))
        return sid

    def _frame(self, f):
        from hyperframe.frame import (DataFrame, GoAwayFrame, HeadersFrame as HF, PingFrame,
                                      RstStreamFrame, SettingsFrame, WindowUpdateFrame)
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            ack = SettingsFrame(0)
            ack.flags.add("ACK")
            self.send(ack.serialize())
        elif isinstance(f, HF):
            self.stream(f.stream_id)["headers"].append(dict(self.dec.decode(f.data)))
            if "END_STREAM" in f.flags:
                self.stream(f.stream_id)["ended"] = True
        elif isinstance(f, DataFrame):
            st = self.stream(f.stream_id)
            st["data"] += f.data
            if f.flow_controlled_length:
                for sid in (0, f.stream_id):
                    w = WindowUpdateFrame(sid)
                    w.window_increment = f.flow_controlled_length
                    self.send(w.serialize())
            if "END_STREAM" in f.flags:
                st["ended"] = True
        elif isinstance(f, RstStreamFrame):
            self.stream(f.stream_id)["reset"] = f.error_code
        elif isinstance(f, GoAwayFrame):
            self.goaway = (f.error_code, f.last_stream_id)
        elif isinstance(f, PingFrame):
            pass

    def pump(self, timeout_s=0.2):
        from hyperframe.frame import Frame
        self.sock.settimeout(max(timeout_s, 0.001))
        try:
            data = self.sock.recv(262144)
        except (socket.timeout, BlockingIOError):
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        self.buf += data
        while len(self.buf) >= 9:
            f, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
            if len(self.buf) < 9 + length:
                break
            f.parse_body(memoryview(self.buf[9:9 + length]))
            self.buf = self.buf[9 + length:]
            self._frame(f)

    def close(self):
        self.sock.close()


def rst_frame(sid, code=8):
    from hyperframe.frame import RstStreamFrame
    f = RstStreamFrame(sid)
    f.error_code = code
    return f.serialize()
