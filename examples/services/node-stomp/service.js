'use strict';
// Consume operations from a STOMP queue, record each one as a row in Postgres, then announce it on
// an output queue. Two variants differ only in when the input message is acknowledged:
//   naive: ACK first, then the database transaction, then the output (an op can be lost);
//   fixed: database transaction with an inbox, then the output, then ACK (at-least-once, deduped).
const pg = require('pg');
const net = require('net');
const stompit = require('stompit');

const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;

// Read and check the configuration; a bad value stops the service before it connects anywhere.
function readConfig(argv, env) {
  let variant = env.VARIANT || 'naive';
  const flag = argv.indexOf('--variant');
  if (flag !== -1) variant = argv[flag + 1];
  const eq = argv.find((a) => a.startsWith('--variant='));
  if (eq) variant = eq.slice('--variant='.length);
  const cfg = {
    variant,
    databaseUrl: env.DATABASE_URL,
    stompHost: env.STOMP_HOST || '127.0.0.1',
    stompPort: Number(env.STOMP_PORT),
    input: env.INPUT,
    output: env.OUTPUT,
    effects: env.EFFECTS_TABLE || 'node_effects',
    inbox: env.INBOX_TABLE || 'node_inbox',
  };
  const problems = [];
  if (!['naive', 'fixed'].includes(variant)) problems.push(`variant ${variant}: use naive or fixed`);
  if (!cfg.databaseUrl) problems.push('DATABASE_URL is not set');
  if (!Number.isInteger(cfg.stompPort) || cfg.stompPort <= 0) problems.push(`STOMP_PORT ${env.STOMP_PORT}`);
  if (!cfg.input || !cfg.output) problems.push('INPUT and OUTPUT queue names must be set');
  for (const t of [cfg.effects, cfg.inbox]) if (!IDENT.test(t)) problems.push(`table name ${t}`);
  if (problems.length) {
    console.error(`bad configuration: ${problems.join('; ')}`);
    process.exit(2);
  }
  return cfg;
}

const cfg = readConfig(process.argv.slice(2), process.env);
let stopping = false;
let busy = false;

function die(what, err) {
  if (stopping) process.exit(0);
  console.error(`${what}: ${err ? err.message || err : 'connection closed'}; exiting`);
  process.exit(1);
}

// Open one STOMP connection; a lost connection ends the process (the supervisor restarts it).
function connectStomp() {
  return new Promise((resolve, reject) => {
    const options = {
      host: cfg.stompHost,
      port: cfg.stompPort,
      connectHeaders: { host: '/', 'heart-beat': '0,0' },
      // Small frames that each wait for a RECEIPT: without TCP_NODELAY every one waits out the
      // peer's delayed ACK (about 40 ms), and the service manages ~11 messages a second.
      connect: (opts, onConnect) => net.connect(opts, onConnect).setNoDelay(true),
    };
    stompit.connect(options, (err, client) => {
      if (err) return reject(err);
      client.on('error', (e) => die('STOMP connection lost', e));
      client.on('end', () => die('STOMP connection lost'));
      resolve(client);
    });
  });
}

// Send a frame and resolve once the broker's RECEIPT for it arrives.
function withReceipt(client, command, headers, body) {
  return new Promise((resolve) => {
    const frame = client.sendFrame(command, headers, { onReceipt: resolve });
    if (body !== undefined) frame.write(body);
    frame.end();
  });
}

// Name the message to acknowledge: `id` is STOMP 1.2, the other two are 1.0/1.1 (sent for both).
function ackHeaders(message) {
  const h = message.headers;
  const all = { id: h.ack, subscription: h.subscription, 'message-id': h['message-id'] };
  return Object.fromEntries(Object.entries(all).filter(([, v]) => v !== undefined));
}

// Apply the operation in ONE transaction; with the inbox, a redelivered op adds no second effect.
async function applyEffect(db, op, amount, useInbox) {
  await db.query('BEGIN');
  try {
    let fresh = true;
    if (useInbox) {
      const r = await db.query(`INSERT INTO ${cfg.inbox} (op_id) VALUES ($1) ON CONFLICT DO NOTHING`, [op]);
      fresh = r.rowCount === 1;
    }
    if (fresh) await db.query(`INSERT INTO ${cfg.effects} (op_id, amount) VALUES ($1, $2)`, [op, amount]);
    await db.query('COMMIT');
    return fresh;
  } catch (err) {
    await db.query('ROLLBACK').catch(() => {});
    throw err;
  }
}

async function handle(client, db, message, body) {
  let op;
  let amount;
  try {
    ({ op, amount } = JSON.parse(body));
    if (typeof op !== 'string' || !Number.isInteger(amount)) throw new Error('missing op or amount');
  } catch (err) {
    // A message we can never process would come back forever: log it and drop it.
    console.error(`dropping malformed message ${message.headers['message-id']}: ${err.message}`);
    await withReceipt(client, 'ACK', ackHeaders(message));
    return;
  }
  const ack = () => withReceipt(client, 'ACK', ackHeaders(message));
  const announce = () =>
    withReceipt(
      client,
      'SEND',
      { destination: `/queue/${cfg.output}`, persistent: 'true', 'content-type': 'application/json' },
      JSON.stringify({ op }),
    );
  if (cfg.variant === 'naive') {
    // The bug: the broker forgets the message before the database has it.
    await ack();
    await applyEffect(db, op, amount, false);
    await announce();
    console.log(`processed ${op} amount=${amount}`);
  } else {
    const fresh = await applyEffect(db, op, amount, true);
    await announce();
    await ack();
    console.log(`processed ${op} amount=${amount}${fresh ? '' : ' (already applied, output re-sent)'}`);
  }
}

async function main() {
  const db = new pg.Client({ connectionString: cfg.databaseUrl });
  db.on('error', (e) => die('database connection lost', e));
  db.on('end', () => die('database connection lost'));
  await db.connect();
  const client = await connectStomp();

  // Messages are handled strictly one after another: in naive mode the broker may deliver the
  // next message as soon as the ACK lands, while this one is still in the database.
  let chain = Promise.resolve();
  const subId = 'input';
  client.setImplicitSubscription(subId, 'client-individual', (err, message) => {
    if (err) return die('STOMP subscription failed', err);
    message.readString('utf-8', (readErr, body) => {
      if (readErr) return die('reading a STOMP message failed', readErr);
      chain = chain.then(async () => {
        busy = true;
        try {
          await handle(client, db, message, body);
        } catch (e) {
          die('processing failed', e);
        }
        busy = false;
        if (stopping) process.exit(0);
      });
    });
  });
  const subscribe = {
    destination: `/queue/${cfg.input}`,
    id: subId,
    ack: 'client-individual',
    'activemq.prefetchSize': '1',
  };
  await withReceipt(client, 'SUBSCRIBE', subscribe);
  console.error(`subscribed to /queue/${cfg.input} (variant ${cfg.variant})`);
  process.stdout.write('READY\n');
}

process.on('SIGTERM', () => {
  stopping = true;
  // Finish the message in hand so a graceful stop never leaves a half-done op behind.
  if (!busy) process.exit(0);
  setTimeout(() => process.exit(0), 5000).unref();
});

main().catch((err) => die('startup failed', err));
