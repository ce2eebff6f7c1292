// A Node.js producer scenario: stdin {"endpoints", "topics", "messages": [{"topic",
// "body", "tag", "keys", "properties", "group", "delay_ms"}], "credentials"?:
// {"accessKey", "accessSecret"}, "ssl"?}; each sent in turn, its receipt (message id, offset,
// recall handle) or its error, one JSON line ({"startup_error"} when startup failed).
'use strict';

const { rocketmq, logger, main } = require('./common');

main(async a => {
  const producer = new rocketmq.Producer({
    endpoints: a.endpoints,
    topics: a.topics,
    // (on a slow machine a send that timed out is sent again: stored twice, as long as
    // the server does not deduplicate sends by message id)
    requestTimeout: 10000,
    sessionCredentials: a.credentials,
    sslEnabled: a.ssl === true,
    logger,
  });
  try {
    await producer.startup();
  } catch (err) {
    return { startup_error: `${err.name}: ${err.message}`, receipts: [] };
  }
  const receipts = [];
  const started = Date.now();
  try {
    for (const m of a.messages) {
      const message = {
        topic: m.topic,
        body: Buffer.from(m.body, 'utf8'),
        tag: m.tag,
        keys: m.keys ?? [],
        properties: new Map(Object.entries(m.properties ?? {})),
      };
      if (m.group) message.messageGroup = m.group;
      if (m.delay_ms) message.delay = m.delay_ms;
      try {
        const r = await producer.send(message);
        receipts.push({
          message_id: r.messageId,
          offset: Number(r.offset),
          recall_handle: r.recallHandle || null,
        });
      } catch (err) {
        receipts.push({ error: `${err.name}: ${err.message}` });
      }
    }
  } finally {
    await producer.shutdown();
  }
  return { receipts, seconds: (Date.now() - started) / 1000 };
});
