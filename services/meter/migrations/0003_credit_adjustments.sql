-- Operators may correct a budget by a signed amount: a credits row with a kind.
-- Still append-only (the triggers stand); a correction is a new row, never an edit.
ALTER TABLE credits ADD COLUMN kind text NOT NULL DEFAULT 'top_up'
  CHECK (kind IN ('top_up', 'adjustment'));
ALTER TABLE credits DROP CONSTRAINT credits_amount_check;
ALTER TABLE credits ADD CONSTRAINT credits_amount_sign
  CHECK ((kind = 'top_up' AND amount > 0) OR (kind = 'adjustment' AND amount <> 0));
