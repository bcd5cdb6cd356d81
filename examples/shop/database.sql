-- The shop: a small database whose tables statetable reads as Debezium change events
-- (`statetable stack up --cdc` creates it on the stack's PostgreSQL, database `shop`).
CREATE TABLE customers (
    id      integer PRIMARY KEY,
    name    text NOT NULL,
    country text NOT NULL
);
CREATE TABLE orders (
    id          integer PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES customers (id),
    amount      numeric(10, 2) NOT NULL,
    status      text NOT NULL DEFAULT 'placed',
    placed_at   timestamp NOT NULL DEFAULT now()
);
INSERT INTO customers VALUES
    (1, 'Ada', 'UK'), (2, 'Grace', 'US'), (3, 'Linus', 'FI'), (4, 'Margaret', 'US'), (5, 'Edsger', 'NL');
INSERT INTO orders (id, customer_id, amount, status, placed_at) VALUES
    (1, 1, 12.50, 'paid', '2026-11-30 09:00:00'), (2, 1, 30.00, 'placed', '2026-11-30 09:05:00'),
    (3, 2, 99.90, 'paid', '2026-11-30 10:00:00'), (4, 3, 5.25, 'paid', '2026-11-30 11:30:00'),
    (5, 4, 42.00, 'placed', '2026-11-30 12:00:00'), (6, 2, 18.75, 'paid', '2026-11-30 12:15:00');
