-- An aggregate over a table's rows: tickets sold per genre, over movie_ticket_genres. When a
-- title sells more, or moves to another genre, its old contribution is retracted from its old
-- group and the new one added; a genre left without titles is deleted. FROM names the table:
-- its schema, change topic and key come with it.
-- schedule: */5 * * * *
-- partitions: 2
CREATE TABLE tickets_per_genre AS
SELECT genre, COUNT(*) AS titles, SUM(tickets_sold) AS tickets_sold, MAX(tickets_sold) AS best,
       TOPK(3, tickets_sold, title) AS best_sellers
FROM movie_ticket_genres
GROUP BY genre;
