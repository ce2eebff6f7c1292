// A Node.js PushConsumer scenario, as scripts/push_consumer.py's: stdin {"endpoints",
// "group", "topic", "until": n, "fail": [bodies], "fail_all": bool, "sleep_ms", "max_ms"}.
// The listener records every delivery; FAILURE for a body in `fail` on its first
// delivery, for every one with `fail_all`, after sleeping `sleep_ms`; SUCCESS otherwise.
// Runs until `until` deliveries were seen (or `max_ms`), then shuts down.
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
  } finally {
    await c.shutdown();
  }
  report.deliveries = deliveries;
  return report;
});
