// sluice - tests/node/grpc_client.js: Node's @grpc/grpc-js as a client of
// tests/grpc_upstream.py's demo.Echo through sluice (no generated code:
// raw bytes both ways). Prints one JSON line per call made:
//   node grpc_client.js HOST:PORT unary N      N unary calls with metadata
//   node grpc_client.js HOST:PORT chat N SIZE  one bidirectional call
const grpc = require('@grpc/grpc-js');

const raw = { serialize: (b) => b, deserialize: (b) => b };
const target = process.argv[2];
const what = process.argv[3];
const client = new grpc.Client(target, grpc.credentials.createInsecure(),
  { 'grpc.max_receive_message_length': 64 << 20 });

function out(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

function unary(i, left) {
  if (left === 0) { client.close(); return; }
  const md = new grpc.Metadata();
  md.set('x-node', 'n' + i);
  let initial = null, res = null;
  const call = client.makeUnaryRequest('/demo.Echo/Unary', raw.serialize, raw.deserialize,
    Buffer.from('node ' + i), md, { deadline: Date.now() + 10000 }, (err, r) => { res = r; });
  call.on('metadata', (m) => { initial = m; });
  call.on('status', (s) => {
    const t = s.metadata.getMap();
    out({ call: i, code: s.code, details: s.details, body: res ? res.toString() : null,
          initial: initial ? initial.get('x-node') : null,
          trailing: t['x-trail'] || null,
          pushback: t['grpc-retry-pushback-ms'] || null });
    setImmediate(() => unary(i + 1, left - 1));
  });
}

function chat(size) {
  const call = client.makeBidiStreamRequest('/demo.Echo/Chat', raw.serialize, raw.deserialize,
    new grpc.Metadata(), { deadline: Date.now() + 30000 });
  let got = 0, n = 0;
  call.on('data', (b) => { got += b.length; n++; });
  call.on('status', (s) => { out({ code: s.code, messages: n, bytes: got }); client.close(); });
  call.on('error', () => {});
  for (let i = 0; i < 3; i++) call.write(Buffer.alloc(size, i));
  call.end();
}

if (what === 'unary') unary(0, parseInt(process.argv[4], 10));
else if (what === 'chat') chat(parseInt(process.argv[5], 10));
else { console.error('unknown ' + what); process.exit(2); }
