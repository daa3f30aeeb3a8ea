-- Tables of the Node.js STOMP example service. The effect table has no unique key on op_id on
-- purpose: an operation applied twice must show as two rows.
CREATE TABLE IF NOT EXISTS node_effects (
    op_id  text NOT NULL,
    amount int  NOT NULL
);

-- The fixed variant records every operation it applied here, in the same transaction as the effect.
CREATE TABLE IF NOT EXISTS node_inbox (
    op_id text PRIMARY KEY
);
