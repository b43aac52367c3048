// sluice - tests/node/rls_client.js: Node's @grpc/grpc-js calling Envoy's
// RLS v3 ShouldRateLimit on sluice's decision listener, with the service and
// messages loaded from the project's own .proto files (src/rls/proto, by
// @grpc/proto-loader: no hand-written encoding). Prints one JSON line per
// call:
//   node rls_client.js HOST:PORT DOMAIN N 'DESCRIPTORS-JSON'
// DESCRIPTORS-JSON: [[["key", "value"], ...], ...] (one list per descriptor).
const path = require('path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const root = path.join(__dirname, '..', '..', 'src', 'rls', 'proto');
const def = loader.loadSync('envoy/service/ratelimit/v3/rls.proto',
  { includeDirs: [root], keepCase: true, longs: Number, enums: String, defaults: true });
const pkg = grpc.loadPackageDefinition(def);
const Service = pkg.envoy.service.ratelimit.v3.RateLimitService;

const [target, domain, n, descs] = process.argv.slice(2);
const client = new Service(target, grpc.credentials.createInsecure());
const descriptors = JSON.parse(descs).map((d) => ({
  entries: d.map(([key, value]) => ({ key, value })),
}));

function out(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

function call(left) {
  if (left === 0) { client.close(); return; }
  client.ShouldRateLimit({ domain, descriptors }, { deadline: Date.now() + 10000 },
    (err, res) => {
      if (err) out({ error: err.code, details: err.details });
      else out({
        overall: res.overall_code,
        statuses: res.statuses.map((s) => ({
          code: s.code,
          remaining: s.limit_remaining,
          rpu: s.current_limit ? s.current_limit.requests_per_unit : null,
          unit: s.current_limit ? s.current_limit.unit : null,
        })),
        headers: Object.fromEntries(res.response_headers_to_add.map((h) => [h.key, h.value])),
      });
      setImmediate(() => call(left - 1));
    });
}

call(parseInt(n, 10));
