-- A join of two tables: each title's ticket count (movie_ticket_totals, itself a table on
-- movie_tickets_sold's change topic) with its genre from movies. A change on either side
-- rewrites exactly the rows it touches; a title movies does not know has a NULL genre (LEFT).
-- Its change topic is what tickets_per_genre aggregates.
-- schedule: */5 * * * *
-- partitions: 2
-- output_topic: movie_ticket_genres_changes
CREATE TABLE movie_ticket_genres AS
SELECT t.title, t.tickets_sold, m.genre
FROM movie_ticket_totals t
LEFT JOIN movies m ON t.title = m.title;
