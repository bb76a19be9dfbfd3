"""An OTLP/HTTP trace receiver for keel's tests: decodes each export request with the
official protobuf definitions (the `opentelemetry-proto` package) and writes every span it
carried as one JSON line to the file named by its first argument. Prints `listening PORT`
once it serves on 127.0.0.1."""

import binascii
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]


def value(v):
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def hexid(b):
    return binascii.hexlify(b).decode()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        lines = []
        for rs in req.resource_spans:
            resource = attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": hexid(s.trace_id),
                        "span_id": hexid(s.span_id),
                        "parent_span_id": hexid(s.parent_span_id),
                        "name": s.name,
                        "kind": s.kind,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": attrs(s.attributes),
                        "links": [{"trace_id": hexid(l.trace_id), "span_id": hexid(l.span_id)} for l in s.links],
                        "status": s.status.code,
                        "scope": ss.scope.name,
                        "resource": resource,
                    }))
        with open(OUT, "a") as f:
            for line in lines:
                f.write(line + "\n")
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening {server.server_address[1]}", flush=True)
server.serve_forever()
