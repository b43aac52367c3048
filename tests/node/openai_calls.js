// sluice - tests/node/openai_calls.js: the openai npm client through sluice.
//
//   node openai_calls.js BASE_URL API_KEY
//
// Four chat completions with a client that does not retry, a fifth with the
// same client (expected: 429), then one with a client that retries
// (maxRetries 3): it reads Retry-After, waits and succeeds. Prints one JSON
// array: per call {ok, tokens} or {ok: false, status, retry_after}, the last
// with waited_ms.
'use strict';

const { OpenAI } = require('openai');

const [base, key] = process.argv.slice(2);
const ask = { model: 'm', messages: [{ role: 'user', content: 'hi' }] };

async function main() {
  const once = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 20000 });
  const patient = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 3, timeout: 20000 });
  const out = [];
  for (let i = 0; i < 5; i++) {
    try {
      const r = await once.chat.completions.create(ask);
      out.push({ ok: true, tokens: r.usage.total_tokens });
    } catch (e) {
      out.push({ ok: false, status: e.status, retry_after: e.headers && e.headers.get('retry-after') });
    }
  }
  const t0 = Date.now();
  try {
    const r = await patient.chat.completions.create(ask);
    out.push({ ok: true, tokens: r.usage.total_tokens, waited_ms: Date.now() - t0 });
  } catch (e) {
    out.push({ ok: false, status: e.status, waited_ms: Date.now() - t0 });
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
