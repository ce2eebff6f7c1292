// Shared by the Node.js scenario scripts (tests/rocketmq/client_env.py run_node_script):
// the JSON arguments on stdin, the client's log on stderr (its default logger writes
// files under the home directory), one JSON line of result on stdout.
'use strict';

const rocketmq = require('rocketmq-client-nodejs');

function readInput() {
  return new Promise((resolve, reject) => {
    let text = '';
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', chunk => { text += chunk; });
    process.stdin.on('end', () => resolve(JSON.parse(text)));
    process.stdin.on('error', reject);
  });
}

function line(level, args) {
  const [first, ...rest] = args;
  const text = typeof first === 'string' ? first : String(first);
  process.stderr.write(`[node ${level}] ${text} ${rest.map(x => JSON.stringify(x)).join(' ')}\n`);
}

const logger = {
  info: (...args) => line('info', args),
  warn: (...args) => line('warn', args),
  error: (...args) => line('error', args),
  debug: () => {},
  close: () => {},
};

function seen(m) {
  return {
    message_id: m.messageId,
    topic: m.topic,
    body: m.body.toString('utf8'),
    tag: m.tag || null,
    keys: [...m.keys].sort(),
    properties: Object.fromEntries(m.properties ?? new Map()),
    message_group: m.messageGroup || null, // ('' when none)
    delivery_attempt: m.deliveryAttempt ?? null,
    corrupted: m.corrupted === true, // (unset unless a digest failed)
    offset: m.offset ?? null,
  };
}

function done(report) {
  process.stdout.write(JSON.stringify(report) + '\n');
}

async function main(run) {
  try {
    done(await run(await readInput()));
    process.exit(0);
  } catch (err) {
    process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  }
}

module.exports = { rocketmq, logger, seen, done, main };
