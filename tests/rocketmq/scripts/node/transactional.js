// A Node.js transactional producer, as scripts/transactional.py: stdin {"endpoints",
// "http", "topic", "transactions": [{"body", "end": "commit"|"rollback"|"open"}],
// "checker": {body: "commit"|"rollback"}, "wait_checks_s"}. Each transaction holds one
// message; "open" ones are left to the server's check, which this producer's checker
// answers as "checker" says (unspecified for a body it does not list). It waits until
// every open one was checked and none of the topic's is pending (LedgerMQ's HTTP API at
// `http`), or `wait_checks_s`. Answers {"sent": [{"message_id", "transaction_id", "end"}
// | {"error"}], "checked": [{"message_id", "body", "topic", "answer"}]}.
'use strict';

const { rocketmq, logger, main } = require('./common');

// TransactionResolution of the protocol (definition.proto)
const RESOLUTIONS = { commit: 1, rollback: 2 };
const UNSPECIFIED = 0;
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function pending(http, topic) {
  const url = `${http}/v1/transactions?producer_group=${encodeURIComponent(topic)}`;
  const r = await fetch(url, { signal: AbortSignal.timeout(5000) });
  return (await r.json()).transactions;
}

main(async a => {
  const checked = [];
  const answers = a.checker ?? {};
  const producer = new rocketmq.Producer({
    endpoints: a.endpoints,
    topics: [a.topic],
    requestTimeout: 10000,
    logger,
    checker: {
      async check(m) {
        const body = m.body.toString('utf8');
        const answer = answers[body] ?? 'unknown';
        checked.push({ message_id: m.messageId, body, topic: m.topic, answer });
        return RESOLUTIONS[answer] ?? UNSPECIFIED;
      },
    },
  });
  await producer.startup();
  const sent = [];
  try {
    for (const spec of a.transactions) {
      try {
        const tx = producer.beginTransaction();
        const r = await producer.send({ topic: a.topic, body: Buffer.from(spec.body, 'utf8') }, tx);
        if (spec.end === 'commit') await tx.commit();
        else if (spec.end === 'rollback') await tx.rollback();
        sent.push({ message_id: r.messageId, transaction_id: r.transactionId, end: spec.end });
      } catch (err) {
        sent.push({ error: `${err.name}: ${err.message}` });
      }
    }
    const open = a.transactions.filter(s => s.end === 'open').map(s => s.body);
    const deadline = Date.now() + (a.wait_checks_s ?? 30) * 1000;
    while (Date.now() < deadline) { // bounded: until every open one was resolved
      const seen = new Set(checked.map(c => c.body));
      if (open.every(b => seen.has(b)) && (await pending(a.http, a.topic)).length === 0) break;
      await sleep(100);
    }
  } finally {
    await producer.shutdown();
  }
  return { sent, checked };
});
