-- Tables of the JMS example service. jms_effects is the first stage's effect: no unique key on
-- op_id on purpose (an operation applied twice shows as two rows); jms_effects_unique is the same
-- with one, for the naive-unique variant (a second apply fails and the message is dead-lettered).
CREATE TABLE IF NOT EXISTS jms_effects (
    op_id  text NOT NULL,
    amount int  NOT NULL
);
CREATE TABLE IF NOT EXISTS jms_effects_unique (
    op_id  text PRIMARY KEY,
    amount int  NOT NULL
);
-- The second stage's effect (a shipment per order).
CREATE TABLE IF NOT EXISTS jms_shipments (
    op_id text NOT NULL
);
