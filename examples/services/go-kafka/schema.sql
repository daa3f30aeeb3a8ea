-- Tables of the orders-go example service. No unique key on op_id: a
-- duplicate effect must stay visible as a second row.
CREATE TABLE IF NOT EXISTS go_effects (
    op_id  text NOT NULL,
    amount int  NOT NULL
);

-- The fixed variant's inbox: one row per consumed record position.
CREATE TABLE IF NOT EXISTS go_inbox (
    topic text   NOT NULL,
    part  int    NOT NULL,
    off   bigint NOT NULL,
    op_id text   NOT NULL,
    PRIMARY KEY (topic, part, off)
);
