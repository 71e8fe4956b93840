-- An endpoint replica's reservation rolls: it holds its whole amount (the endpoint's
-- horizon of spend) for as long as its allocation is open, instead of shrinking as
-- the ledger consumes it. The column is now created with the table, by admission's
-- migration 0004 (budget holds are admission's); a database this file already ran on
-- has it, and 0004 finds it there.
SELECT 1;
