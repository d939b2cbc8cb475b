// Open-loop load for OpenAI-compatible endpoints (k6 constant-arrival-rate).
// Env: URL, RATE (req/s), DURATION (e.g. 15s), STREAM (0|1), MAX_TOKENS.
import http from 'k6/http';
import { check } from 'k6';

const rate = parseInt(__ENV.RATE || '100');
export const options = {
  discardResponseBodies: false,
  summaryTrendStats: ['med', 'p(90)', 'p(99)', 'avg', 'max'],
  scenarios: {
    load: {
      executor: 'constant-arrival-rate',
      rate: rate,
      timeUnit: '1s',
      duration: __ENV.DURATION || '15s',
      preAllocatedVUs: Math.max(50, rate / 4),
      maxVUs: Math.max(500, rate * 2),
    },
  },
};

const stream = __ENV.STREAM === '1';
const body = JSON.stringify({
  model: 'sim-model',
  stream: stream,
  max_tokens: parseInt(__ENV.MAX_TOKENS || '16'),
  messages: [{ role: 'user', content: 'benchmark prompt' }],
});
// AUTH: an Authorization header for every path alike (LiteLLM's proxy requires a key).
const headers = { 'content-type': 'application/json' };
if (__ENV.AUTH) headers['authorization'] = __ENV.AUTH;
const params = { headers: headers };

export default function () {
  const r = http.post(__ENV.URL, body, params);
  check(r, {
    'status 200': (x) => x.status === 200,
    'complete': (x) => !stream || (x.body && x.body.endsWith('data: [DONE]\n\n')),
  });
}
