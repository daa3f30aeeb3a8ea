-- Tables of the Spring Kafka example service. sk_effects has no unique key on op_id on purpose:
-- an order applied twice shows as two rows. The indexed variant claims each order in sk_inbox in
-- the effect's transaction.
CREATE TABLE IF NOT EXISTS sk_effects (
    op_id  text NOT NULL,
    amount int  NOT NULL
);
CREATE TABLE IF NOT EXISTS sk_inbox (
    op_id text PRIMARY KEY
);
