-- The video-game leaderboard of the seed: each score event is enriched with
-- its player and product, and the three highest scores of each game are kept.
-- topic: score-events
-- schema: score DOUBLE, product_id BIGINT, player_id BIGINT
-- partitions: 4
-- schedule: */5 * * * *
CREATE TABLE leaderboard AS
SELECT s.product_id, TOPK(3, s.score, s.player_id, s.product_id, p.name, g.name) AS top3
FROM score_events s
JOIN players p ON s.player_id = p.id
JOIN products g ON s.product_id = g.id
GROUP BY s.product_id;
