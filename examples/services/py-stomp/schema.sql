-- Tables of the Python STOMP example service. The effect table has no unique key on op_id on
-- purpose: an operation applied twice must show as two rows.
CREATE TABLE IF NOT EXISTS py_effects (
    op_id  text NOT NULL,
    amount int  NOT NULL
);

-- The fixed variant claims every operation here, in the same transaction as its effect.
CREATE TABLE IF NOT EXISTS py_inbox (
    op_id text PRIMARY KEY
);
