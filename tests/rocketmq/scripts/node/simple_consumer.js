// A Node.js SimpleConsumer scenario, as scripts/simple_consumer.py's (durations in ms):
// stdin {"endpoints", "group", "topic", "expect": n, "invisible_ms", "await_ms"}
// 1. receive until `expect` messages came (or a deadline);
// 2. change the first one's invisible time to 1 s (its handle is replaced), then try to
//    ack it with its old handle (refused);
// 3. ack all the others;
// 4. receive until the first comes again: its attempt; ack it;
// 5. one more receive: nothing is left.
'use strict';

const { rocketmq, logger, seen, main } = require('./common');

main(async a => {
  const c = new rocketmq.SimpleConsumer({
    endpoints: a.endpoints,
    consumerGroup: a.group,
    subscriptions: new Map([[a.topic, '*']]),
    awaitDuration: a.await_ms,
    requestTimeout: 10000,
    logger,
  });
  await c.startup();
  const report = {};
  try {
    const got = [];
    let deadline = Date.now() + 30000;
    while (got.length < a.expect && Date.now() < deadline) {
      got.push(...await c.receive(16, a.invisible_ms));
    }
    report.received = got.map(seen);
    const [first, ...rest] = got;
    const old = first.receiptHandle;
    await c.changeInvisibleDuration(first, 1000);
    report.handle_replaced = first.receiptHandle !== old;
    const fresh = first.receiptHandle;
    first.receiptHandle = old;
    try {
      await c.ack(first);
      report.old_handle_ack = 'accepted';
    } catch (err) {
      report.old_handle_ack = `refused: ${err.name}: ${err.message} ${err.code ?? ''}`;
    }
    first.receiptHandle = fresh;
    for (const m of rest) await c.ack(m);
    let again = [];
    deadline = Date.now() + 30000;
    while (again.length === 0 && Date.now() < deadline) {
      again = (await c.receive(16, a.invisible_ms)).filter(m => m.messageId === first.messageId);
    }
    report.again = again.map(seen);
    for (const m of again) await c.ack(m);
    report.left = (await c.receive(16, a.invisible_ms)).map(seen);
  } finally {
    await c.shutdown();
  }
  return report;
});
