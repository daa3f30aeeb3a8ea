-- The orders service's tables. txchaos runs this file at the start of every run (then empties
-- the tables), so every statement must be idempotent.

-- One row per order placed. No unique key on op_id: the naive handler relies on the message
-- being delivered once.
CREATE TABLE IF NOT EXISTS orders (
    id        bigserial   PRIMARY KEY,
    op_id     text        NOT NULL,
    amount    integer     NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now()
);

-- The inbox of the fixed handler: one row per message id it has handled, written in the same
-- transaction as the order.
CREATE TABLE IF NOT EXISTS orders_inbox (
    op_id   text        PRIMARY KEY,
    seen_at timestamptz NOT NULL DEFAULT now()
);
