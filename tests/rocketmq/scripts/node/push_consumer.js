// A Node.js PushConsumer scenario, as scripts/push_consumer.py's: stdin {"endpoints",
// "group", "topic", "until": n, "fail": [bodies], "fail_all": bool, "sleep_ms", "max_ms",
// "dead_url", "dead": n}. The listener records every delivery; FAILURE for a body in
// `fail` on its first delivery, for every one with `fail_all`, after sleeping `sleep_ms`;
// SUCCESS otherwise. Runs until `until` deliveries were seen and, with `dead_url` (a
// group's GET /v1/groups/{group}), until the group counts `dead` dead letters (the client
// forwards them after the last failure), or `max_ms`; then shuts down.
'use strict';

const { rocketmq, logger, seen, main } = require('./common');

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

main(async a => {
  const deliveries = [];
  const failed = new Set();
  const c = new rocketmq.PushConsumer({
    endpoints: a.endpoints,
    consumerGroup: a.group,
    subscriptions: new Map([[a.topic, '*']]),
    requestTimeout: 10000,
    logger,
    messageListener: {
      async consume(m) {
        const body = m.body.toString('utf8');
        if (a.sleep_ms) await sleep(a.sleep_ms);
        const fail = a.fail_all || ((a.fail ?? []).includes(body) && !failed.has(body));
        if (fail) failed.add(body);
        deliveries.push({ ...seen(m), result: fail ? 'failure' : 'success', t: Date.now() });
        return fail ? rocketmq.ConsumeResult.FAILURE : rocketmq.ConsumeResult.SUCCESS;
      },
    },
  });
  const started = Date.now();
  await c.startup();
  const report = { startup_ms: Date.now() - started };
  try {
    const deadline = Date.now() + (a.max_ms ?? 60000);
    while (deliveries.length < a.until && Date.now() < deadline) await sleep(50);
    while (a.dead_url && Date.now() < deadline) {
      const r = await fetch(a.dead_url, { signal: AbortSignal.timeout(5000) });
      const doc = await r.json();
      report.dead_lettered = doc.topics.reduce((n, t) => n + t.dead_lettered, 0);
      if (report.dead_lettered >= a.dead) break;
      await sleep(100);
    }
  } finally {
    await c.shutdown();
  }
  report.deliveries = deliveries;
  return report;
});
